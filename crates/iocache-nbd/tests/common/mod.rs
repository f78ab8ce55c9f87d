//! Shared helpers of the integration tests: temporary socket paths, a
//! server on a Unix socket and an ephemeral TCP port, exports that record
//! or delay calls, and a raw protocol connection for tests that must send
//! bytes our own client never would.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use iocache_nbd::proto::*;
use iocache_nbd::{Export, ExportError, InPlace, MemExport, RunningServer, Server, ServerConfig};

/// A fresh path for a socket in the temporary directory.
pub fn temp_socket(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("iocache-nbd-{}-{tag}-{n}.sock", std::process::id()))
}

/// A config listening on a new Unix socket and 127.0.0.1:0.
pub fn config(tag: &str) -> ServerConfig {
    ServerConfig {
        unix_socket: Some(temp_socket(tag)),
        tcp: Some("127.0.0.1:0".parse().unwrap()),
        handshake_timeout: Some(Duration::from_secs(5)),
        reply_timeout: Some(Duration::from_secs(5)),
        ..ServerConfig::default()
    }
}

/// A running server with one export (the default) named "disk".
pub fn start(tag: &str, export: Arc<dyn Export>) -> RunningServer {
    start_with(config(tag), vec![("disk", export)])
}

pub fn start_with(config: ServerConfig, exports: Vec<(&str, Arc<dyn Export>)>) -> RunningServer {
    let mut s = Server::new(config);
    for (name, e) in exports {
        s.add_export(name, e).unwrap();
    }
    s.start().unwrap()
}

pub fn mem(size: usize) -> Arc<MemExport> {
    Arc::new(MemExport::new(size))
}

/// Deterministic bytes for a write at `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An export with only the methods it must have, over a [`MemExport`]:
/// every other method is the trait's default (zeroes written as zero
/// buffers, so zeroing is not fast).
pub struct DefaultsOnly(pub MemExport);

impl Export for DefaultsOnly {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
}

/// A MemExport wrapper that counts flushes and FUA writes, and can delay
/// operations at chosen offsets.
pub struct Instrumented {
    pub inner: MemExport,
    pub flushes: AtomicU64,
    pub fua_writes: AtomicU64,
    /// Writes that have reached the export (counted before any delay).
    pub writes_started: AtomicU64,
    pub trims: Mutex<Vec<(u64, u64)>>,
    pub zeroes: Mutex<Vec<(u64, u64, bool, bool)>>,
    pub slow_offsets: Mutex<Vec<(u64, Duration)>>,
    pub multi_conn: bool,
    /// Say every read is quick, the slow ones too (a wrong hint).
    pub claims_quick: bool,
}

impl Instrumented {
    pub fn new(size: usize) -> Instrumented {
        Instrumented {
            inner: MemExport::new(size),
            flushes: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            writes_started: AtomicU64::new(0),
            trims: Mutex::new(Vec::new()),
            zeroes: Mutex::new(Vec::new()),
            slow_offsets: Mutex::new(Vec::new()),
            multi_conn: false,
            claims_quick: false,
        }
    }

    /// Makes operations at `offset` take `delay`.
    pub fn slow_at(&self, offset: u64, delay: Duration) {
        self.slow_offsets.lock().unwrap().push((offset, delay));
    }

    fn delay(&self, offset: u64) -> Option<Duration> {
        self.slow_offsets
            .lock()
            .unwrap()
            .iter()
            .find(|(o, _)| *o == offset)
            .map(|(_, d)| *d)
    }

    fn maybe_sleep(&self, offset: u64) {
        if let Some(d) = self.delay(offset) {
            std::thread::sleep(d);
        }
    }
}

impl Export for Instrumented {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.maybe_sleep(offset);
        self.inner.read(offset, buf)
    }
    fn read_in_place(&self, offset: u64, buf: &mut [u8], in_place: InPlace<'_>) -> Result<bool, ExportError> {
        self.maybe_sleep(offset);
        self.inner.read_in_place(offset, buf, in_place)
    }
    fn read_is_quick(&self, offset: u64, length: u64) -> bool {
        (self.claims_quick || self.delay(offset).is_none()) && self.inner.read_is_quick(offset, length)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.writes_started.fetch_add(1, Ordering::SeqCst);
        self.maybe_sleep(offset);
        if fua {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn trim(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.trims.lock().unwrap().push((offset, length));
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool, no_hole: bool) -> Result<(), ExportError> {
        self.zeroes.lock().unwrap().push((offset, length, fua, no_hole));
        self.inner.write_zeroes(offset, length, fua, no_hole)
    }
    fn can_multi_conn(&self) -> bool {
        self.multi_conn
    }
}

/// A connection speaking the protocol by hand: handshake with NBD_OPT_GO,
/// then raw requests and replies.
pub struct Raw {
    pub s: UnixStream,
    pub structured: bool,
    pub flags: u16,
}

impl Raw {
    pub fn connect(server: &RunningServer, structured: bool) -> Raw {
        let mut s = UnixStream::connect(server.unix_path().unwrap()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = [0u8; GREETING_LEN];
        s.read_exact(&mut g).unwrap();
        parse_greeting(&g).unwrap();
        s.write_all(&(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        if structured {
            s.write_all(&encode_option(NBD_OPT_STRUCTURED_REPLY, &[]))
                .unwrap();
            let (t, _) = read_opt_reply(&mut s);
            assert_eq!(t, NBD_REP_ACK);
        }
        let go = InfoRequest {
            name: String::new(),
            requests: vec![NBD_INFO_BLOCK_SIZE],
        };
        s.write_all(&encode_option(NBD_OPT_GO, &go.encode())).unwrap();
        let mut flags = 0;
        loop {
            let (t, d) = read_opt_reply(&mut s);
            match t {
                NBD_REP_INFO => {
                    if let Info::Export { flags: f, .. } = Info::parse(&d).unwrap() {
                        flags = f;
                    }
                }
                NBD_REP_ACK => break,
                other => panic!("GO failed: {other:#x}"),
            }
        }
        Raw { s, structured, flags }
    }

    pub fn send(&mut self, handle: u64, command: u16, flags: u16, offset: u64, length: u32, payload: &[u8]) {
        let bytes = iocache_nbd::fuzzing::request(command, flags, handle, offset, length, payload);
        self.s.write_all(&bytes).unwrap();
    }

    /// Reads one complete reply: (handle, errno, data). `read_len` is the
    /// length of data a successful simple read reply carries (the stream is
    /// not self-describing without structured replies).
    pub fn recv(&mut self, read_len: impl Fn(u64) -> usize) -> (u64, u32, Vec<u8>) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).unwrap();
        let magic = u32::from_be_bytes(m);
        if magic == NBD_SIMPLE_REPLY_MAGIC {
            let mut b = [0u8; SIMPLE_REPLY_LEN];
            b[..4].copy_from_slice(&m);
            self.s.read_exact(&mut b[4..]).unwrap();
            let r = SimpleReply::parse(&b).unwrap();
            let mut data = Vec::new();
            if r.errno == 0 {
                data = vec![0u8; read_len(r.handle)];
                self.s.read_exact(&mut data).unwrap();
            }
            return (r.handle, r.errno, data);
        }
        assert_eq!(magic, NBD_STRUCTURED_REPLY_MAGIC);
        let mut data = Vec::new();
        let mut errno = 0;
        let mut first = true;
        let mut mb = m;
        loop {
            if !first {
                self.s.read_exact(&mut mb).unwrap();
                assert_eq!(u32::from_be_bytes(mb), NBD_STRUCTURED_REPLY_MAGIC);
            }
            first = false;
            let mut b = [0u8; STRUCTURED_HEADER_LEN];
            b[..4].copy_from_slice(&mb);
            self.s.read_exact(&mut b[4..]).unwrap();
            let h = StructuredHeader::parse(&b).unwrap();
            let handle = h.handle;
            let mut p = vec![0u8; h.length as usize];
            self.s.read_exact(&mut p).unwrap();
            match h.chunk_type {
                NBD_REPLY_TYPE_OFFSET_DATA => data.extend_from_slice(&p[8..]),
                NBD_REPLY_TYPE_NONE => {}
                t => errno = parse_error_chunk(t, &p).unwrap().errno,
            }
            if h.done() {
                return (handle, errno, data);
            }
        }
    }
}

pub fn read_opt_reply(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; OPTION_REPLY_HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let h = OptionReplyHeader::parse(&h).unwrap();
    let mut d = vec![0u8; h.length as usize];
    s.read_exact(&mut d).unwrap();
    (h.reply_type, d)
}
