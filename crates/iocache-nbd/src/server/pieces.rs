//! READs and WRITEs larger than the export's maximum block size (up to
//! `max_request_bytes`), served a piece at a time: one piece of budget and
//! one piece of memory, whatever the request's length.

use super::*;

impl<S: ConnectionStream> Conn<'_, S> {
    /// The largest piece served at once: the maximum block size advertised
    /// for the export (at most `limits.max_payload`).
    pub(super) fn piece_bytes(&self) -> usize {
        self.neg.block_sizes.2 as usize
    }

    /// Whether `req` is a WRITE whose payload is read a piece at a time.
    pub(super) fn is_split_write(&self, req: &Request) -> bool {
        req.command == Command::Write && req.length as usize > self.piece_bytes()
    }

    /// Serves a WRITE above the largest piece while holding the reader
    /// role: reads its payload a piece at a time and writes each piece
    /// (with FUA when asked) before reading the next. A request the export
    /// refuses (or a piece it fails) still has its payload read, then is
    /// answered with the error; pieces before a failed one may have been
    /// written, as a failed WRITE allows. `Err`: the payload did not
    /// arrive, and the connection stops reading.
    pub(super) fn write_in_pieces(
        &self,
        job: Job,
        reader: &mut RequestReader<S>,
        buffer: &mut Vec<u8>,
    ) -> io::Result<()> {
        let (req, cost) = (job.req, job.cost);
        let export = &*self.neg.export;
        let mut failure = self.check(&req).err();
        let config = &self.shared.config;
        let pressure = || self.shared.global.contended();
        let mut offset = req.offset;
        let mut left = req.length as usize;
        while left > 0 {
            let piece = sized(buffer, left.min(self.piece_bytes()));
            if let Err(e) = reader.read_payload(piece, config.reply_timeout, config.stall_timeout, pressure) {
                self.done(cost);
                return Err(e);
            }
            if failure.is_none() && !self.broken.load(Ordering::Relaxed) {
                if let Err(e) = guarded(|| export.write(offset, piece, req.flags.fua())) {
                    failure = Some((e.nbd_errno(), e.to_string()));
                }
            }
            offset += piece.len() as u64;
            left -= piece.len();
        }
        // This thread holds the reader role: its reply never waits.
        let reply = match failure {
            None => {
                self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
                encode_simple_reply(req.handle, 0).to_vec()
            }
            Some((errno, message)) => self.error_reply(req.handle, errno, &message),
        };
        self.send_without_waiting(&reply, &[cost]);
        Ok(())
    }

    /// Serves a READ above the largest piece: one reply (a simple reply,
    /// or one data chunk) whose data is read and written a piece at a
    /// time, the connection's other replies waiting meanwhile. A failure
    /// of the first piece is answered as an error; a later one, after the
    /// reply's header left, can only close the connection (the client
    /// sees the reply cut short, never wrong data).
    pub(super) fn read_in_pieces(
        &self,
        export: &dyn Export,
        req: &Request,
        cost: usize,
        buffer: &mut Vec<u8>,
    ) {
        let first_len = self.piece_bytes();
        let first = sized(buffer, first_len);
        if let Err(e) = guarded(|| export.read(req.offset, first)) {
            self.reply_error(req.handle, cost, e.nbd_errno(), &e.to_string());
            return;
        }
        self.shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        let header: Vec<u8> = if self.neg.structured {
            // Cannot fail: 0 < length <= MAX_MAX_PAYLOAD.
            encode_chunk_offset_data_header(req.handle, req.offset, req.length, true)
                .map(|h| h.to_vec())
                .unwrap_or_default()
        } else {
            encode_simple_reply(req.handle, 0).to_vec()
        };
        self.send_exclusive(cost, |write| {
            write(&header)?;
            write(&buffer[..first_len])?;
            let mut offset = req.offset + first_len as u64;
            let mut left = req.length as usize - first_len;
            while left > 0 {
                let piece = sized(buffer, left.min(first_len));
                guarded(|| export.read(offset, piece))
                    .map_err(|e| io::Error::other(format!("a later piece of a large read failed: {e}")))?;
                write(piece)?;
                offset += piece.len() as u64;
                left -= piece.len();
            }
            Ok(())
        });
    }
}
