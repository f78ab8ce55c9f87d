//! TLS for NBD clients (NBD_OPT_STARTTLS), end to end with real clients:
//! nbdinfo (libnbd, `nbds://`) and qemu-io (QEMU's `tls-creds-x509`), on
//! TCP and on the Unix socket, in `--tls require` and `--tls on`. The
//! certificates are made for each run with the openssl command. Skipped
//! (with a message) when openssl, nbdinfo or qemu-io is missing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg(if tool == "openssl" { "version" } else { "--version" })
        .output()
        .is_ok_and(|o| o.status.success())
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-tls-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A CA, and a server certificate it signed for localhost and 127.0.0.1,
/// in `dir` with the names nbdkit, qemu and libnbd use.
fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let ssl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    ssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=iocache test CA",
    ]);
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    ssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-out",
        "server-cert.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

struct Served {
    child: Child,
    port: u16,
    socket: PathBuf,
}

impl Served {
    fn start(dir: &Path, mode: &str, pki: &Path) -> Served {
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_iocache"))
            .args([
                "serve",
                "--backend-size",
                "32MiB",
                "--cache-size",
                "4MiB",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--tls", mode, "--tls-certificates"])
            .arg(pki)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut served = Served {
            child,
            port: 0,
            socket: dir.join("iocache-data/iocache.sock"),
        };
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(dir.join("server.log")).unwrap();
            if let Some(port) = text
                .split("nbd://127.0.0.1:")
                .nth(1)
                .and_then(|r| r.split('/').next())
                .and_then(|p| p.parse().ok())
            {
                served.port = port;
                return served;
            }
            assert!(
                served.child.try_wait().unwrap().is_none(),
                "the server exited: {text}"
            );
            assert!(started.elapsed() < Duration::from_secs(20), "no banner: {text}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(mut self) {
        run(Command::new("kill").args(["-TERM", &self.child.id().to_string()]));
        assert!(self.child.wait().unwrap().success());
    }
}

fn nbdinfo_size(uri: &str) -> Result<String, String> {
    let out = Command::new("nbdinfo").args(["--size", uri]).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// qemu-io over TLS (x509 credentials from `pki`) against `server`.
fn qemu_io_tls(server: &str, pki: &Path, commands: &[&str]) -> String {
    let mut cmd = Command::new("qemu-io");
    cmd.arg("--object")
        .arg(format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            pki.display()
        ))
        .arg("--image-opts");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = run(cmd.arg(format!(
        "driver=nbd,{server},tls-creds=tls0,tls-hostname=localhost"
    )));
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn tls_required_serves_nbdinfo_and_qemu_io_and_refuses_plain_clients() {
    if !have("openssl") || !have("nbdinfo") || !have("qemu-io") {
        eprintln!("SKIPPED: needs openssl, nbdinfo and qemu-io");
        return;
    }
    let dir = temp_dir("require");
    let pki = dir.join("pki");
    make_pki(&pki);
    let served = Served::start(&dir, "require", &pki);
    let tcp = format!("127.0.0.1:{}", served.port);

    // Without TLS: refused, on TCP and on the Unix socket.
    let err = nbdinfo_size(&format!("nbd://{tcp}/")).unwrap_err();
    assert!(err.contains("requires TLS"), "{err}");
    let err = nbdinfo_size(&format!("nbd+unix:///?socket={}", served.socket.display())).unwrap_err();
    assert!(err.contains("requires TLS"), "{err}");

    // With TLS: served.
    let certs = format!("tls-certificates={}", pki.display());
    assert_eq!(
        nbdinfo_size(&format!("nbds://{tcp}/?{certs}")).unwrap(),
        (32u64 << 20).to_string()
    );
    assert_eq!(
        nbdinfo_size(&format!(
            "nbds+unix:///?socket={}&{certs}&tls-hostname=localhost",
            served.socket.display()
        ))
        .unwrap(),
        (32u64 << 20).to_string()
    );
    let server = format!(
        "server.type=inet,server.host=127.0.0.1,server.port={}",
        served.port
    );
    let out = qemu_io_tls(
        &server,
        &pki,
        &["write -P 0x5c 0 8M", "flush", "read -P 0x5c 0 8M"],
    );
    assert!(out.contains("read 8388608/8388608"), "{out}");
    // Data written through TLS is read back through TLS on the Unix socket.
    let server = format!("server.type=unix,server.path={}", served.socket.display());
    let out = qemu_io_tls(&server, &pki, &["read -P 0x5c 0 8M"]);
    assert!(out.contains("read 8388608/8388608"), "{out}");

    // A client that does not trust the certificate is refused by itself.
    let other = dir.join("other-pki");
    make_pki(&other);
    let err = nbdinfo_size(&format!("nbds://{tcp}/?tls-certificates={}", other.display())).unwrap_err();
    assert!(!err.is_empty());
    served.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_on_serves_both_and_bad_credentials_are_named() {
    if !have("openssl") || !have("nbdinfo") {
        eprintln!("SKIPPED: needs openssl and nbdinfo");
        return;
    }
    let dir = temp_dir("on");
    let pki = dir.join("pki");
    make_pki(&pki);
    let served = Served::start(&dir, "on", &pki);
    let tcp = format!("127.0.0.1:{}", served.port);
    let size = (32u64 << 20).to_string();
    assert_eq!(nbdinfo_size(&format!("nbd://{tcp}/")).unwrap(), size);
    assert_eq!(
        nbdinfo_size(&format!("nbds://{tcp}/?tls-certificates={}", pki.display())).unwrap(),
        size
    );
    served.stop();

    // Credentials that are missing or do not match are named at start.
    let refuse = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
            .args(["serve", "--backend-size", "32MiB", "--cache-size", "4MiB"])
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let err = refuse(&["--tls", "require"]);
    assert!(
        err.contains("--tls") && err.contains("--tls-certificates"),
        "{err}"
    );
    let err = refuse(&["--tls", "maybe"]);
    assert!(err.contains("expected off, on or require"), "{err}");
    std::fs::copy(pki.join("ca-key.pem"), pki.join("server-key.pem")).unwrap();
    let err = refuse(&["--tls", "on", "--tls-certificates", pki.to_str().unwrap()]);
    assert!(
        err.contains("server-key.pem") && err.contains("does not match"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
