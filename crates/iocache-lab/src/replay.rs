//! A real trace replayed against the real engine rather than the
//! simulator. fio cannot replay a trace's mix of addresses, sizes, reads
//! and writes over NBD, so the trace's requests are read into memory
//! ([`TraceRequests`]) and issued by the project's own NBD client
//! ([`replay_nbd`]): a closed loop of connections, each with one request
//! in flight, taking the trace's requests in order. The in-process lookup
//! reproduction replays the same [`TraceRequests`] on the engine itself.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

use iocache_core::IoKind;
use iocache_nbd::{Client, ConnectOptions};
use iocache_trace::TraceReader;

use crate::error::{tool, LabError, Result};
use crate::live::Side;

/// Each volume's addresses start on a boundary of this many bytes.
const VOLUME_ALIGN: u64 = 1 << 20;

/// One request of a trace, at its place in the one address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceIo {
    pub offset: u64,
    pub length: u64,
    pub write: bool,
}

/// A trace's requests in order, its volumes laid side by side: volume
/// `v`'s byte `b` is at the sum of the spans of the volumes numbered below
/// `v` plus `b`, each span the volume's highest address rounded up to 1
/// MiB. Within a volume every address keeps its place, so a line of the
/// trace is a line here and every hit and miss is the trace's own.
#[derive(Clone, Debug, Default)]
pub struct TraceRequests {
    pub ios: Vec<TraceIo>,
    /// The address space's size: what the backend must hold.
    pub span_bytes: u64,
    pub volumes: usize,
}

impl TraceRequests {
    /// Every request `reader` gives, as the simulator reads it (aligned
    /// outward to 512-byte sectors).
    pub fn read(reader: TraceReader) -> Result<TraceRequests> {
        let mut raw = Vec::new();
        let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
        for record in reader {
            let r = iocache_sim::request_of(&record?);
            let end = ends.entry(r.volume).or_default();
            *end = (*end).max(r.offset_bytes + r.length_bytes);
            raw.push(r);
        }
        let mut bases = BTreeMap::new();
        let mut span = 0u64;
        for (&volume, &end) in &ends {
            bases.insert(volume, span);
            span += end.div_ceil(VOLUME_ALIGN) * VOLUME_ALIGN;
        }
        let ios = raw
            .iter()
            .map(|r| TraceIo {
                offset: bases[&r.volume] + r.offset_bytes,
                length: r.length_bytes,
                write: r.kind == IoKind::Write,
            })
            .collect();
        Ok(TraceRequests {
            ios,
            span_bytes: span,
            volumes: ends.len(),
        })
    }

    /// The longest request, in bytes.
    pub fn max_length(&self) -> u64 {
        self.ios.iter().map(|io| io.length).max().unwrap_or(0)
    }
}

/// The bytes a replay writes at `offset`: each 512-byte sector starts
/// with its own address (the rest is zero), so a test can tell where
/// every written sector landed.
pub fn fill_write(buf: &mut [u8], offset: u64) {
    for (i, sector) in buf.chunks_mut(512).enumerate() {
        let tag = (offset + i as u64 * 512).to_le_bytes();
        let n = tag.len().min(sector.len());
        sector[..n].copy_from_slice(&tag[..n]);
    }
}

/// Latencies of one side (reads or writes) of a replay, in ns.
#[derive(Default)]
struct Latencies {
    ns: Vec<u64>,
    bytes: u64,
}

/// Percentile `p` (0-100) of sorted values (0 when there are none).
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

impl Latencies {
    fn side(mut self, seconds: f64) -> Side {
        self.ns.sort_unstable();
        let ios = self.ns.len() as u64;
        let per_second = |n: f64| if seconds > 0.0 { n / seconds } else { 0.0 };
        Side {
            ios,
            bytes: self.bytes,
            iops: per_second(ios as f64),
            mbps: per_second(self.bytes as f64 / 1e6),
            p50_ns: percentile(&self.ns, 50.0),
            p99_ns: percentile(&self.ns, 99.0),
            p99_9_ns: percentile(&self.ns, 99.9),
            p99_99_ns: percentile(&self.ns, 99.99),
        }
    }
}

/// What a replay did: reads and writes (counts, bytes, rates, latency
/// percentiles) and how long it took from the first request sent to the
/// last answered.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replayed {
    pub read: Side,
    pub write: Side,
    pub seconds: f64,
}

/// Replays `ios` in order against the NBD export `export` on the Unix
/// socket `socket`: `connections` connections (all open before the clock
/// starts), each sending the next request of the trace as soon as its
/// previous one is answered, so `connections` requests are in flight
/// (a closed loop; the trace's times are not kept). Stops early, with
/// [`LabError::Interrupted`], when `stop` is set.
pub fn replay_nbd(
    socket: &Path,
    export: &str,
    ios: &[TraceIo],
    connections: usize,
    stop: &AtomicBool,
) -> Result<Replayed> {
    let connections = connections.clamp(1, ios.len().max(1));
    let options = ConnectOptions::export(export);
    let clients = (0..connections)
        .map(|_| Client::connect_unix(socket, &options))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| tool!("connecting to {}: {e}", socket.display()))?;
    let longest = ios.iter().map(|io| io.length).max().unwrap_or(0) as usize;
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<LabError>> = Mutex::new(None);
    let start = Barrier::new(connections + 1);
    let sides: Mutex<[Latencies; 2]> = Mutex::new(Default::default());
    let mut started = Instant::now();
    std::thread::scope(|scope| {
        for mut client in clients {
            let (next, failed, start, sides) = (&next, &failed, &start, &sides);
            scope.spawn(move || {
                let mut buf = vec![0u8; longest];
                let mut mine: [Latencies; 2] = Default::default();
                start.wait();
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(io) = ios.get(i) else { break };
                    let data = &mut buf[..io.length as usize];
                    let at = Instant::now();
                    let result = if io.write {
                        fill_write(data, io.offset);
                        client.write(io.offset, data, false)
                    } else {
                        client.read(io.offset, data)
                    };
                    let ns = at.elapsed().as_nanos() as u64;
                    if let Err(e) = result {
                        let what = if io.write { "write" } else { "read" };
                        failed
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(tool!(
                                "request {i} of the trace ({what} of {} bytes at {}): {e}",
                                io.length,
                                io.offset
                            ));
                        // The others stop at their next request.
                        next.store(ios.len(), Ordering::Relaxed);
                        break;
                    }
                    let side = &mut mine[usize::from(io.write)];
                    side.ns.push(ns);
                    side.bytes += io.length;
                }
                let mut all = sides.lock().unwrap_or_else(|p| p.into_inner());
                for (total, part) in all.iter_mut().zip(mine) {
                    total.ns.extend(part.ns);
                    total.bytes += part.bytes;
                }
                let _ = client.disconnect();
            });
        }
        start.wait();
        started = Instant::now();
    });
    let seconds = started.elapsed().as_secs_f64();
    if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    if stop.load(Ordering::SeqCst) {
        return Err(LabError::Interrupted);
    }
    let [read, write] = sides.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(Replayed {
        read: read.side(seconds),
        write: write.side(seconds),
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use iocache_nbd::{Export, MemExport, Server, ServerConfig};
    use iocache_trace::{ReaderOptions, TraceFormat};
    use std::sync::Arc;

    /// DiskSim text: time, volume, sector, sectors, 1 = read, 0 = write.
    fn requests(text: &str) -> TraceRequests {
        let reader = TraceReader::from_bytes(
            "t",
            text.as_bytes().to_vec(),
            Some(TraceFormat::Disksim),
            ReaderOptions::default(),
        )
        .unwrap();
        TraceRequests::read(reader).unwrap()
    }

    #[test]
    fn volumes_are_laid_side_by_side_and_keep_their_addresses() {
        // Volume 7 reaches 3 MiB + 512 B (4 MiB once rounded), volume 2
        // 1 KiB (1 MiB): volume 2 first, then 7 from 1 MiB on.
        let r = requests("0 7 6144 1 1\n1 2 0 2 0\n2 7 0 8 1\n");
        assert_eq!(r.volumes, 2);
        assert_eq!(r.span_bytes, (1 << 20) + (4 << 20));
        let at = |offset, length, write| TraceIo {
            offset,
            length,
            write,
        };
        assert_eq!(
            r.ios,
            vec![
                at((1 << 20) + 6144 * 512, 512, false),
                at(0, 1024, true),
                at(1 << 20, 4096, false)
            ]
        );
        assert_eq!(r.max_length(), 4096);
    }

    /// Over a real NBD server (in process, on a memory export), a replay
    /// issues every request once, counts the bytes each side moved, and
    /// its writes land where the trace put them.
    #[test]
    fn a_replay_over_nbd_moves_the_trace_s_bytes() {
        let mut text = String::new();
        let (mut reads, mut writes, mut read_bytes, mut written) = (0, 0, 0, Vec::new());
        for i in 0..400u64 {
            let (volume, sector, sectors) = (i % 3, (i * 37) % 2000, 1 + i % 16);
            let write = i % 4 == 0;
            text += &format!("{i} {volume} {sector} {sectors} {}\n", u8::from(!write));
            if write {
                writes += 1;
                written.push((volume, sector, sectors));
            } else {
                reads += 1;
                read_bytes += sectors * 512;
            }
        }
        let trace = requests(&text);
        assert_eq!(trace.ios.len(), 400);
        let export = Arc::new(MemExport::new(trace.span_bytes as usize));
        let dir = std::env::temp_dir().join(format!("iocache-replay-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nbd.sock");
        let mut server = Server::new(ServerConfig {
            unix_socket: Some(socket.clone()),
            ..ServerConfig::default()
        });
        server.add_export("t", export.clone()).unwrap();
        let running = server.start().unwrap();
        let stop = AtomicBool::new(false);
        let replayed = replay_nbd(&socket, "t", &trace.ios, 4, &stop).unwrap();
        running.shutdown();
        assert_eq!((replayed.read.ios, replayed.write.ios), (reads, writes));
        assert_eq!(replayed.read.bytes, read_bytes);
        assert_eq!(
            replayed.write.bytes,
            written.iter().map(|w| w.2 * 512).sum::<u64>()
        );
        assert!(replayed.seconds > 0.0 && replayed.read.iops > 0.0);
        assert!(replayed.read.p50_ns <= replayed.read.p99_99_ns && replayed.read.p50_ns > 0);
        // Each written sector holds its own address, at its volume's place.
        for (volume, sector, sectors) in written {
            let base = [0, 1 << 20, 2 << 20][volume as usize];
            for s in sector..sector + sectors {
                let at = base + s * 512;
                let mut tag = [0u8; 8];
                export.read(at, &mut tag).unwrap();
                assert_eq!(u64::from_le_bytes(tag), at, "volume {volume} sector {s}");
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn percentiles_of_sorted_latencies() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 50.0), 500);
        assert_eq!(percentile(&v, 99.0), 990);
        assert_eq!(percentile(&v, 99.99), 1000);
        assert_eq!(percentile(&[], 50.0), 0);
    }
}
