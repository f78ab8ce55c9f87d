//! SIGINT and SIGTERM: they set one flag, which a server (and a live lab
//! run) polls to stop in order.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT or SIGTERM: the server stops (and `attach` is refused).
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set [`STOP`].
pub fn install_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}
