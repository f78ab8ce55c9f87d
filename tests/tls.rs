//! TLS for NBD clients (NBD_OPT_STARTTLS), end to end with real clients:
//! nbdinfo and nbdcopy (libnbd, `nbds://`) and qemu-io (QEMU's
//! `tls-creds-x509` and `tls-creds-psk`), on TCP and on the Unix socket, in
//! `--tls require` and `--tls on`, with certificates, pre-shared keys
//! (`--tls-psk`) and client certificates (`--tls-verify-peer`). The
//! certificates are made for each run with the openssl command. When
//! openssl, nbdinfo, nbdcopy or qemu-io is missing a test says SKIPPED and
//! passes, except under CI (`CI` set, as `.ci/run` does), where it fails:
//! CI installs them (scripts/test.sh), so a missing one is a broken setup.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::{missing, skip_unless_ci, temp_dir, Process, TestDir};

/// Whether every tool in `tools` is installed; if not, says SKIPPED (or,
/// under CI, fails the test naming what is missing).
fn need(tools: &[&str]) -> bool {
    let missing = missing(tools);
    if !missing.is_empty() {
        skip_unless_ci(&missing.join(", "));
    }
    missing.is_empty()
}

/// A fresh directory for one test, when every tool in `tools` is
/// installed (see [`need`]).
fn dir_with(tools: &[&str], name: &str) -> Option<TestDir> {
    need(tools).then(|| temp_dir(name))
}

/// DIR/pki made by [`make_pki`].
fn pki_in(dir: &Path) -> PathBuf {
    let pki = dir.join("pki");
    make_pki(&pki);
    pki
}

/// [`dir_with`], and DIR/pki made by [`make_pki`] in it.
fn dir_with_pki(tools: &[&str], name: &str) -> Option<(TestDir, PathBuf)> {
    let dir = dir_with(tools, name)?;
    let pki = pki_in(&dir);
    Some((dir, pki))
}

/// DIR/keys.psk holding one random key, for `alice`.
fn alice_psk(dir: &Path) -> PathBuf {
    let psk = dir.join("keys.psk");
    write_psk(&psk, &format!("alice:{}\n", random_key()));
    psk
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

/// Runs `openssl ARGS` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    run(Command::new("openssl").args(args).current_dir(dir));
}

/// A key and a certificate for `subject` in `dir` (NAME-key.pem,
/// NAME-cert.pem), signed by the CA in `ca_dir` with the extensions `ext`.
fn make_signed_cert(dir: &Path, ca_dir: &Path, name: &str, subject: &str, ext: &str) {
    let (key, csr, cert) = (
        format!("{name}-key.pem"),
        format!("{name}.csr"),
        format!("{name}-cert.pem"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    );
    std::fs::write(dir.join("ext.cnf"), ext).unwrap();
    let ca_cert = ca_dir.join("ca-cert.pem");
    let ca_key = ca_dir.join("ca-key.pem");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            ca_cert.to_str().unwrap(),
            "-CAkey",
            ca_key.to_str().unwrap(),
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

/// A CA, and a server certificate it signed for localhost and 127.0.0.1,
/// in `dir` with the names nbdkit, qemu and libnbd use.
fn make_pki(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    openssl(
        dir,
        &[
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
        ],
    );
    make_signed_cert(
        dir,
        dir,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    );
}

struct Served {
    process: Process,
    dir: PathBuf,
    port: u16,
    socket: PathBuf,
}

impl Served {
    fn start(dir: &Path, mode: &str, pki: &Path) -> Served {
        Served::start_with(
            dir,
            &["--tls", mode, "--tls-certificates", &pki.display().to_string()],
        )
    }

    /// Starts a server with these TLS arguments.
    fn start_with(dir: &Path, tls_args: &[&str]) -> Served {
        let mut args = vec![
            "--backend-size",
            "32MiB",
            "--cache-size",
            "4MiB",
            "--listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(tls_args);
        Served::start_serve(dir, &args)
    }

    /// `nbds://` on its TCP port, for a client with the certificates in
    /// `certs`.
    fn certificates_uri(&self, certs: &Path) -> String {
        format!(
            "nbds://127.0.0.1:{}/?tls-certificates={}",
            self.port,
            certs.display()
        )
    }

    /// `nbds://USER@` on its TCP port, for a client with the keys in `psk`.
    fn psk_uri(&self, user: &str, psk: &Path) -> String {
        format!(
            "nbds://{user}@127.0.0.1:{}/?tls-psk-file={}",
            self.port,
            psk.display()
        )
    }

    /// Starts a server requiring TLS with the certificates in `pki`, the
    /// keys in the PSK file `psk` and the TLS arguments `extra`.
    fn start_certificates_and_psk(dir: &Path, pki: &Path, psk: &Path, extra: &[&str]) -> Served {
        let (pki, psk) = (pki.display().to_string(), psk.display().to_string());
        let mut args = vec!["--tls", "require", "--tls-certificates", &pki, "--tls-psk", &psk];
        args.extend_from_slice(extra);
        Served::start_with(dir, &args)
    }

    /// Starts `iocache serve ARGS` in `dir`; ready once its banner names
    /// the TCP port it listens on.
    fn start_serve(dir: &Path, args: &[&str]) -> Served {
        let (process, port) = Process::serve_tcp(dir, args);
        Served {
            port,
            process,
            dir: dir.to_path_buf(),
            socket: dir.join("iocache-data/iocache.sock"),
        }
    }

    /// The server's log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap()
    }

    /// The server's log once it holds every one of `needles` (a refused
    /// client may exit before the server has logged why), or after 10 s.
    fn log_with(&self, needles: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let log = self.log();
            if needles.iter().all(|n| log.contains(n)) || started.elapsed() > Duration::from_secs(10) {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(self) {
        assert!(self.process.stop().success());
    }
}

/// Runs `iocache serve` in `dir` with a small backend and cache and
/// `args`, a start that must be refused: its error.
fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_iocache"))
        .args(["serve", "--backend-size", "32MiB", "--cache-size", "4MiB"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{args:?} started");
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// Asserts that nbdinfo is served the whole export (32 MiB) at `uri`.
fn assert_served(uri: &str) {
    assert_eq!(nbdinfo_size(uri).unwrap(), (32u64 << 20).to_string(), "{uri}");
}

/// qemu's option for the server's TCP `port` on 127.0.0.1.
fn inet(port: u16) -> String {
    format!("server.type=inet,server.host=127.0.0.1,server.port={port}")
}

fn nbdinfo_size(uri: &str) -> Result<String, String> {
    let out = Command::new("nbdinfo").args(["--size", uri]).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// qemu's TLS credentials object (id `tls0`) for the x509 files in `pki`.
fn x509_creds(pki: &Path) -> String {
    format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", pki.display())
}

/// Writes 8 MiB of `pattern` with qemu-io through TLS (credentials object
/// `creds`) on TCP, then reads it back through TLS on TCP and on the Unix
/// socket: both listeners serve the same data.
fn qemu_round_trip(served: &Served, creds: &str, pattern: u8) {
    let write = format!("write -P {pattern:#04x} 0 8M");
    let read = format!("read -P {pattern:#04x} 0 8M");
    let out = qemu_io_with(creds, &inet(served.port), &[&write, "flush", &read]).unwrap();
    assert!(out.contains("read 8388608/8388608"), "{out}");
    let unix = format!("server.type=unix,server.path={}", served.socket.display());
    let out = qemu_io_with(creds, &unix, &[&read]).unwrap();
    assert!(out.contains("read 8388608/8388608"), "{out}");
}

/// qemu-io with the TLS credentials object `creds` (id `tls0`) against
/// `server`: its output, or its error when it failed.
fn qemu_io_with(creds: &str, server: &str, commands: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("qemu-io");
    cmd.arg("--object").arg(creds).arg("--image-opts");
    for c in commands {
        cmd.args(["-c", c]);
    }
    let out = cmd
        .arg(format!(
            "driver=nbd,{server},tls-creds=tls0,tls-hostname=localhost"
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() && !stdout.contains("error") {
        Ok(stdout)
    } else {
        Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
    }
}

#[test]
fn tls_required_serves_nbdinfo_and_qemu_io_and_refuses_plain_clients() {
    let Some((dir, pki)) = dir_with_pki(&["openssl", "nbdinfo", "qemu-io"], "require") else {
        return;
    };
    let served = Served::start(&dir, "require", &pki);
    let tcp = format!("127.0.0.1:{}", served.port);
    // The banner names the URIs that work: the TLS schemes only.
    let banner = served.log();
    assert!(
        banner.contains("TLS is required") && banner.contains("nbds+unix:///") && banner.contains("nbds://"),
        "{banner}"
    );
    assert!(
        !banner.contains("nbd+unix://") && !banner.contains(" nbd://"),
        "{banner}"
    );

    // Without TLS: refused, on TCP and on the Unix socket.
    let err = nbdinfo_size(&format!("nbd://{tcp}/")).unwrap_err();
    assert!(err.contains("requires TLS"), "{err}");
    let err = nbdinfo_size(&format!("nbd+unix:///?socket={}", served.socket.display())).unwrap_err();
    assert!(err.contains("requires TLS"), "{err}");

    // With TLS: served.
    assert_served(&served.certificates_uri(&pki));
    assert_served(&format!(
        "nbds+unix:///?socket={}&tls-certificates={}&tls-hostname=localhost",
        served.socket.display(),
        pki.display()
    ));
    // Data written through TLS is read back through TLS on the Unix socket.
    qemu_round_trip(&served, &x509_creds(&pki), 0x5c);

    // A client that does not trust the certificate is refused by itself.
    let other = dir.join("other-pki");
    make_pki(&other);
    let err = nbdinfo_size(&served.certificates_uri(&other)).unwrap_err();
    assert!(!err.is_empty());
    served.stop();
}

#[test]
fn tls_on_serves_both_and_bad_credentials_are_named() {
    let Some((dir, pki)) = dir_with_pki(&["openssl", "nbdinfo"], "on") else {
        return;
    };
    let served = Served::start(&dir, "on", &pki);
    let tcp = format!("127.0.0.1:{}", served.port);
    assert_served(&format!("nbd://{tcp}/"));
    assert_served(&served.certificates_uri(&pki));
    served.stop();

    // Credentials that are missing or do not match are named at start.
    let refuse = |args: &[&str]| serve_refused(&dir, args);
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
}

/// Writes `lines` as a PSK file (mode 0600, as the server requires).
fn write_psk(path: &Path, lines: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, lines).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A random key, as `psktool` makes them (32 bytes, hex).
fn random_key() -> String {
    let out = run(Command::new("openssl").args(["rand", "-hex", "32"]));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The first `len` bytes of the export, read with nbdcopy.
fn nbdcopy_head(uri: &str, len: usize) -> Vec<u8> {
    let out = run(Command::new("nbdcopy").args([uri, "-"]));
    out.stdout[..len].to_vec()
}

#[test]
fn psk_serves_nbdinfo_and_qemu_io_and_refuses_wrong_keys_and_identities() {
    let Some(dir) = dir_with(&["openssl", "nbdinfo", "nbdcopy", "qemu-io"], "psk") else {
        return;
    };
    let key = random_key();
    let psk = dir.join("keys.psk");
    write_psk(&psk, &format!("alice:{key}\ncarol:{}\n", random_key()));
    // qemu's tls-creds-psk reads DIR/keys.psk.
    let qemu_dir = dir.join("qemu");
    std::fs::create_dir_all(&qemu_dir).unwrap();
    write_psk(&qemu_dir.join("keys.psk"), &format!("alice:{key}\n"));
    let served = Served::start_with(
        &dir,
        &["--tls", "require", "--tls-psk", &psk.display().to_string()],
    );
    let tcp = format!("127.0.0.1:{}", served.port);

    // Plain clients are refused; PSK clients are served, on TCP and Unix.
    let err = nbdinfo_size(&format!("nbd://{tcp}/")).unwrap_err();
    assert!(err.contains("requires TLS"), "{err}");
    let uri = served.psk_uri("alice", &psk);
    assert_served(&uri);
    let creds = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        qemu_dir.display()
    );
    qemu_round_trip(&served, &creds, 0x3a);
    // libnbd reads back, through PSK, what qemu wrote through PSK.
    let data = nbdcopy_head(&uri, 8 << 20);
    assert!(data.iter().all(|&b| b == 0x3a), "nbdcopy read other bytes");

    // A wrong key for a known identity, and an identity not in the file,
    // are refused by the handshake, and the log says which.
    let wrong = dir.join("wrong.psk");
    write_psk(&wrong, &format!("alice:{}\nmallory:{key}\n", random_key()));
    let err = nbdinfo_size(&served.psk_uri("alice", &wrong)).unwrap_err();
    assert!(!err.is_empty());
    let err = nbdinfo_size(&served.psk_uri("mallory", &wrong)).unwrap_err();
    assert!(!err.is_empty());
    let wrong_dir = dir.join("qemu-wrong");
    std::fs::create_dir_all(&wrong_dir).unwrap();
    std::fs::copy(&wrong, wrong_dir.join("keys.psk")).unwrap();
    let creds = format!(
        "tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice",
        wrong_dir.display()
    );
    assert!(qemu_io_with(&creds, &inet(served.port), &["read 0 4k"]).is_err());
    let log = served.log_with(&[
        "PSK identity `alice`: the client's key differs",
        "PSK identity `mallory` is not in",
    ]);
    assert!(
        log.contains("PSK identity `alice`: the client's key differs"),
        "{log}"
    );
    assert!(
        log.contains("PSK identity `mallory` is not in") && log.contains("keys.psk"),
        "{log}"
    );
    served.stop();

    // Certificates and PSK together: either kind of client is served.
    let pki = pki_in(&dir);
    let served = Served::start_certificates_and_psk(&dir, &pki, &psk, &[]);
    assert_served(&served.psk_uri("alice", &psk));
    assert_served(&served.certificates_uri(&pki));
    served.stop();
}

#[test]
fn malformed_or_exposed_psk_files_are_refused_at_start() {
    let dir = temp_dir("psk-bad");
    let psk = dir.join("keys.psk");
    let refuse = |text: &str| {
        write_psk(&psk, text);
        serve_refused(&dir, &["--tls", "on", "--tls-psk", psk.to_str().unwrap()])
    };
    let cases = [
        ("alice:00112233\nbob:00zz\n", "line 2", "not hex"),
        ("alice:00112233\nbob 0011\n", "line 2", "no `:`"),
        ("alice:00112233\n\n:0011\n", "line 3", "empty identity"),
        ("alice:00112233\nalice:0011\n", "line 2", "given twice"),
        ("alice:001\n", "line 1", "odd number"),
    ];
    for (text, line, what) in cases {
        let err = refuse(text);
        assert!(
            err.contains("--tls-psk") && err.contains(&format!("keys.psk, {line}")) && err.contains(what),
            "{text:?}: {err}"
        );
    }
    // Readable by others: refused, as ssh refuses such keys.
    std::fs::write(&psk, "alice:00112233\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&psk, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let err = serve_refused(&dir, &["--tls", "on", "--tls-psk", psk.to_str().unwrap()]);
    assert!(err.contains("mode 0644") && err.contains("chmod 600"), "{err}");
    // --tls-verify-peer needs the certificates directory (its CA).
    write_psk(&psk, "alice:00112233\n");
    let err = serve_refused(
        &dir,
        &[
            "--tls",
            "on",
            "--tls-verify-peer",
            "--tls-psk",
            psk.to_str().unwrap(),
        ],
    );
    assert!(
        err.contains("--tls-verify-peer needs --tls-certificates"),
        "{err}"
    );
}

/// A client certificate signed by the CA in `ca_dir`, with the CA's
/// certificate, in `dir` as qemu and libnbd look for them.
fn make_client_cert(dir: &Path, ca_dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(ca_dir.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    make_signed_cert(
        dir,
        ca_dir,
        "client",
        "/CN=iocache test client",
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    );
}

#[test]
fn verify_peer_requires_a_client_certificate_from_the_ca() {
    let Some((dir, pki)) = dir_with_pki(&["openssl", "nbdinfo", "qemu-io"], "verify-peer") else {
        return;
    };
    // A client with a certificate from the server's CA; one with none (the
    // CA only, to trust the server); one with a certificate from another CA
    // of the same name (make_pki names every CA alike), which GnuTLS clients
    // send, so that the server's own check refuses it.
    let good = dir.join("client");
    make_client_cert(&good, &pki);
    let none = dir.join("anonymous");
    std::fs::create_dir_all(&none).unwrap();
    std::fs::copy(pki.join("ca-cert.pem"), none.join("ca-cert.pem")).unwrap();
    let other_ca = dir.join("other-pki");
    make_pki(&other_ca);
    let stranger = dir.join("stranger");
    make_client_cert(&stranger, &other_ca);
    std::fs::copy(pki.join("ca-cert.pem"), stranger.join("ca-cert.pem")).unwrap();

    // Clients with a key from the PSK file need no certificate.
    let psk = alice_psk(&dir);
    let served = Served::start_certificates_and_psk(&dir, &pki, &psk, &["--tls-verify-peer"]);
    let server = inet(served.port);

    // Accepted: qemu-io and nbdinfo with a certificate from the CA.
    let out = qemu_io_with(
        &x509_creds(&good),
        &server,
        &["write -P 0x77 0 4M", "read -P 0x77 0 4M"],
    )
    .unwrap();
    assert!(out.contains("read 4194304/4194304"), "{out}");
    assert_served(&served.certificates_uri(&good));
    assert_served(&served.psk_uri("alice", &psk));
    // Refused: no client certificate, or one from another CA.
    let err = qemu_io_with(&x509_creds(&none), &server, &["read 0 4k"]).unwrap_err();
    assert!(!err.is_empty());
    nbdinfo_size(&served.certificates_uri(&none)).unwrap_err();
    qemu_io_with(&x509_creds(&stranger), &server, &["read 0 4k"]).unwrap_err();
    nbdinfo_size(&served.certificates_uri(&stranger)).unwrap_err();
    let log = served.log_with(&["peer did not return a certificate", "certificate verify failed"]);
    assert!(log.contains("peer did not return a certificate"), "{log}");
    assert!(log.contains("certificate verify failed"), "{log}");
    served.stop();

    // Without --tls-verify-peer the anonymous client is served.
    let served = Served::start(&dir, "require", &pki);
    assert_served(&served.certificates_uri(&none));
    served.stop();
}

#[test]
fn a_config_file_takes_the_psk_file() {
    let Some(dir) = dir_with(&["nbdinfo", "openssl"], "psk-config") else {
        return;
    };
    let psk = alice_psk(&dir);
    std::fs::write(
        dir.join("iocache.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nsocket = \"iocache-data/iocache.sock\"\n\
             tls = \"require\"\ntls_psk = \"{}\"\n\n[[volume]]\nexport = \"psk\"\n\
             backend = \"iocache-data/b.img\"\nbackend_size = \"32MiB\"\n\
             cache = \"iocache-data/c.img\"\ncache_size = \"4MiB\"\n",
            psk.display()
        ),
    )
    .unwrap();
    let served = Served::start_serve(&dir, &["--config", "iocache.toml"]);
    let tcp = format!("127.0.0.1:{}", served.port);
    assert_served(&format!("nbds://alice@{tcp}/psk?tls-psk-file={}", psk.display()));
    served.stop();
}

/// TLS credentials without `--tls` serve plaintext, and the log says so.
#[test]
fn credentials_without_tls_are_named_in_a_warning() {
    let dir = temp_dir("credentials-plain");
    let served = Served::start_with(&dir, &["--tls-certificates", &dir.display().to_string()]);
    let log = served.log();
    assert!(
        log.contains(
            "--tls-certificates has no effect without --tls on or require: clients are served in plaintext"
        ),
        "{log}"
    );
    served.stop();
}
