//! SIGINT, SIGTERM and SIGHUP: they set one flag, which a server (and a
//! live lab run) polls to stop in order; and SIGPIPE for the commands that
//! only print.

use std::sync::atomic::{AtomicBool, Ordering};

/// Set by SIGINT, SIGTERM or SIGHUP: the server stops (and `attach` is
/// refused).
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Makes SIGINT, SIGTERM and SIGHUP set [`STOP`]. SIGHUP stops as SIGTERM
/// does (a closed terminal, a supervisor's hang-up): there is no reload,
/// and never an unclean death.
pub fn install_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGHUP, handler);
    }
}

/// For a command that only prints (stats, sim, trace ...): a write to a
/// closed pipe (`iocache stats | head -1`) ends the process quietly, as it
/// does any Unix filter, instead of panicking in `println!`. Not for a
/// server, which must outlive a reader that went away.
pub fn die_quietly_on_closed_pipes() {
    // SAFETY: restoring the default disposition of a signal.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
