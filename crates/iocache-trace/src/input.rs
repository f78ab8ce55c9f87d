//! Raw input handling: byte counting for progress and transparent
//! decompression chosen by the stream's magic bytes.
//!
//! Published traces come as `.gz`, `.zst` or `.bz2` as often as plain text,
//! and file names are not reliable, so the first bytes decide: gzip
//! (`1f 8b`), zstd (`28 b5 2f fd`), bzip2 (`BZh`), anything else is read as
//! is. Concatenated gzip members, zstd frames and bzip2 streams are all read
//! to the end.

use std::io::{self, BufReader, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Capacity of the buffers between the raw input, the decompressor and the
/// line reader.
pub(crate) const BUFFER_BYTES: usize = 256 * 1024;

/// The compression detected on an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Plain text.
    None,
    /// gzip (RFC 1952).
    Gzip,
    /// Zstandard.
    Zstd,
    /// bzip2.
    Bzip2,
}

impl Compression {
    /// Identifies the compression from the first bytes of a stream (up to 4
    /// are looked at).
    pub fn sniff(magic: &[u8]) -> Compression {
        match magic {
            [0x1f, 0x8b, ..] => Compression::Gzip,
            [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
            [b'B', b'Z', b'h', ..] => Compression::Bzip2,
            _ => Compression::None,
        }
    }
}

/// Counts the bytes read through it into a shared counter, so the reader can
/// report progress while the stream is owned by a decompressor.
pub(crate) struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R> CountingReader<R> {
    pub(crate) fn new(inner: R, count: Arc<AtomicU64>) -> Self {
        CountingReader { inner, count }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// Reads up to `buf.len()` bytes, stopping early only at end of input.
fn read_up_to(input: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Wraps `input` in the decompressor its first bytes call for.
pub(crate) fn decompress(mut input: Box<dyn Read + Send>) -> io::Result<(Box<dyn Read + Send>, Compression)> {
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut input, &mut magic)?;
    let compression = Compression::sniff(&magic[..n]);
    // Put the sniffed bytes back in front of the rest of the stream.
    let whole = io::Cursor::new(magic[..n].to_vec()).chain(input);
    let decoded: Box<dyn Read + Send> = match compression {
        Compression::None => Box::new(whole),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(BufReader::with_capacity(
            BUFFER_BYTES,
            whole,
        ))),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(
            BufReader::with_capacity(BUFFER_BYTES, whole),
        )?),
        Compression::Bzip2 => Box::new(bzip2::bufread::MultiBzDecoder::new(BufReader::with_capacity(
            BUFFER_BYTES,
            whole,
        ))),
    };
    Ok((decoded, compression))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sniffing() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(Compression::sniff(b"BZh9"), Compression::Bzip2);
        assert_eq!(Compression::sniff(b"1,2"), Compression::None);
        assert_eq!(Compression::sniff(b""), Compression::None);
        assert_eq!(Compression::sniff(&[0x28, 0xb5]), Compression::None);
    }

    #[test]
    fn counting_and_plain_passthrough() {
        let count = Arc::new(AtomicU64::new(0));
        let data = b"a\nbc\n".to_vec();
        let raw = CountingReader::new(io::Cursor::new(data.clone()), count.clone());
        let (mut decoded, compression) = decompress(Box::new(raw)).unwrap();
        assert_eq!(compression, Compression::None);
        let mut out = Vec::new();
        decoded.read_to_end(&mut out).unwrap();
        assert_eq!(out, data);
        assert_eq!(count.load(Ordering::Relaxed), data.len() as u64);
    }

    #[test]
    fn tiny_inputs() {
        for data in [&b""[..], b"1", b"12\n"] {
            let (mut decoded, compression) = decompress(Box::new(io::Cursor::new(data.to_vec()))).unwrap();
            assert_eq!(compression, Compression::None);
            let mut out = Vec::new();
            decoded.read_to_end(&mut out).unwrap();
            assert_eq!(out, data);
        }
    }
}
