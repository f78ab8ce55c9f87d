//! NBD conformance through libnbd: scripts/nbd-conformance.py probes every
//! command, flag and errno `iocache serve` advertises, over the Unix
//! socket, TCP and TLS (a pre-shared key), and a read-only export's
//! refusals. It needs libnbd's Python binding (python3-libnbd, for
//! /usr/bin/python3): without it the test says SKIPPED and passes, except
//! under CI (`CI` set), where scripts/test.sh installs it.

use std::path::Path;
use std::process::Command;

mod common;
use common::{skip_unless_ci, temp_dir, Process};

const PYTHON: &str = "/usr/bin/python3";

/// Whether libnbd's Python binding imports; if not, says SKIPPED (or,
/// under CI, fails).
fn have_libnbd_python() -> bool {
    let ok = Command::new(PYTHON)
        .args(["-c", "import nbd"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip_unless_ci("libnbd's Python binding (Debian: python3-libnbd)");
    }
    ok
}

/// Runs the probe with `args`; panics with its report unless every check
/// passed. Returns how many ran.
fn probe(args: &[&str]) -> usize {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/nbd-conformance.py");
    let out = Command::new(PYTHON).arg(&script).args(args).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{args:?}:\n{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = report.lines().last().unwrap_or_default();
    summary
        .split(" checks, 0 failed")
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {report}"))
}

/// A PSK file with the identity `alice` (mode 0600, as the server requires).
fn write_psk(path: &Path) {
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut key)
        .unwrap();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(path, format!("alice:{hex}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn every_command_flag_and_errno_over_unix_tcp_and_tls() {
    if !have_libnbd_python() {
        return;
    }
    let dir = temp_dir("conformance");
    let psk = dir.join("keys.psk");
    write_psk(&psk);
    let psk_text = psk.display().to_string();
    let common_args = [
        "--backend-size",
        "128MiB",
        "--cache-size",
        "16MiB",
        "--listen",
        "127.0.0.1:0",
    ];
    let (server, port) = Process::serve_tcp(
        &dir,
        &[&common_args[..], &["--tls", "on", "--tls-psk", &psk_text]].concat(),
    );
    let socket = dir.join("iocache-data/iocache.sock");
    let uris = [
        format!("nbd+unix:///?socket={}", socket.display()),
        format!("nbd://127.0.0.1:{port}/"),
        format!("nbds://alice@127.0.0.1:{port}/?tls-psk-file={psk_text}"),
    ];
    for uri in &uris {
        let checks = probe(&[uri]);
        assert!(checks >= 20, "{uri}: only {checks} checks ran");
    }
    assert!(server.stop().success());

    let ro_dir = temp_dir("conformance-ro");
    let (server, port) = Process::serve_tcp(&ro_dir, &[&common_args[..], &["--read-only"]].concat());
    let checks = probe(&["--read-only-uri", &format!("nbd://127.0.0.1:{port}/")]);
    assert!(checks >= 5, "read-only: only {checks} checks ran");
    assert!(server.stop().success());
}
