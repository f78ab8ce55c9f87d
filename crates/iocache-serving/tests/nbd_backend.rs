//! A remote NBD backend that stalls, restarts or is replaced:
//! once, a stalled server hung misses and FLUSH forever, and a restarted
//! one was never reconnected (EIO until iocache restarted). Served here by
//! this repository's own NBD server, in process, with an export that can
//! be made to stall.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use iocache_device::BlockDevice;
use iocache_nbd::{Export, ExportError, MemExport, RunningServer, Server, ServerConfig};
use iocache_serving::NbdBackend;

/// An export whose reads and flushes wait while `stall` is set.
struct Stalling {
    inner: Arc<MemExport>,
    stall: Arc<AtomicBool>,
}

impl Stalling {
    fn wait(&self) {
        while self.stall.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Export for Stalling {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ExportError> {
        self.wait();
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.wait();
        self.inner.flush()
    }
}

fn serve(socket: &std::path::Path, export: Arc<dyn Export>) -> RunningServer {
    let mut server = Server::new(ServerConfig {
        unix_socket: Some(socket.to_path_buf()),
        ..ServerConfig::default()
    });
    server.add_export("disk", export).unwrap();
    server.start().unwrap()
}

fn temp_socket(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-nbd-backend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("backend.sock")
}

/// Retries `f` until it succeeds or `limit` passes.
fn eventually<T, E: std::fmt::Display>(limit: Duration, mut f: impl FnMut() -> Result<T, E>) -> T {
    let started = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if started.elapsed() < limit => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("still failing after {limit:?}: {e}"),
        }
    }
}

#[test]
fn a_stalled_backend_times_out_fails_fast_and_is_used_again_when_it_answers() {
    let socket = temp_socket("stall");
    let data = Arc::new(MemExport::new(1 << 20));
    let stall = Arc::new(AtomicBool::new(false));
    let _server = serve(
        &socket,
        Arc::new(Stalling {
            inner: Arc::clone(&data),
            stall: Arc::clone(&stall),
        }),
    );
    let uri = format!("nbd+unix:///disk?socket={}", socket.display());
    let backend = NbdBackend::connect_with(&uri, 2, Duration::from_millis(300)).unwrap();
    backend.write_at(&[7u8; 4096], 8192).unwrap();
    backend.flush().unwrap();

    stall.store(true, Ordering::SeqCst);
    let mut buf = vec![0u8; 4096];
    // A read that must fail, and within `limit`.
    let fails_within = |limit: Duration, buf: &mut [u8]| {
        let started = Instant::now();
        let err = backend.read_at(buf, 8192).unwrap_err();
        let took = started.elapsed();
        assert!(took < limit, "a failing read took {took:?}, more than {limit:?}");
        err
    };
    let err = fails_within(Duration::from_secs(3), &mut buf);
    // While the breaker is open, requests fail at once and say why.
    let err2 = fails_within(Duration::from_millis(50), &mut buf);
    assert!(err2.to_string().contains("unreachable"), "{err2} (first: {err})");
    assert!(backend.flush().is_err());

    stall.store(false, Ordering::SeqCst);
    eventually(Duration::from_secs(10), || backend.read_at(&mut buf, 8192));
    assert!(buf.iter().all(|&b| b == 7));
    // Requests take the connections in turn: the one the stall broke is
    // opened again.
    for _ in 0..4 {
        eventually(Duration::from_secs(10), || backend.read_at(&mut buf, 8192));
    }
    assert!(backend.reconnects() >= 1);
    backend.flush().unwrap();
}

#[test]
fn a_restarted_backend_is_reconnected_and_a_different_volume_is_refused() {
    let socket = temp_socket("restart");
    let data = Arc::new(MemExport::new(1 << 20));
    let server = serve(&socket, Arc::clone(&data) as Arc<dyn Export>);
    let uri = format!("nbd+unix:///disk?socket={}", socket.display());
    let backend = NbdBackend::connect_with(&uri, 3, Duration::from_secs(2)).unwrap();
    backend.write_at(&[9u8; 4096], 0).unwrap();
    backend.flush().unwrap();

    server.shutdown();
    let mut buf = vec![0u8; 4096];
    assert!(backend.read_at(&mut buf, 0).is_err(), "the server is gone");
    // The same volume comes back at the same address.
    let server = serve(&socket, Arc::clone(&data) as Arc<dyn Export>);
    eventually(Duration::from_secs(10), || backend.read_at(&mut buf, 0));
    assert!(buf.iter().all(|&b| b == 9));
    backend.write_at(&[10u8; 4096], 4096).unwrap();
    backend.flush().unwrap();
    server.shutdown();

    // Another volume (another size) at that address is never used.
    let _other = serve(&socket, Arc::new(MemExport::new(2 << 20)));
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(3) {
        match backend.read_at(&mut buf, 0) {
            Ok(()) => panic!("read from a different volume"),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        last.contains("not the volume") || last.contains("unreachable"),
        "{last}"
    );
}
