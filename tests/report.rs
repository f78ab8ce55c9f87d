//! The HTML reports in a real browser: `lab report`, `sim --report` and
//! `trace mrc --report` pages are loaded by headless Chromium (Debian's
//! `chromium-headless-shell`, or `chromium`), which must parse them with
//! every plot in the DOM, rasterize them to a screenshot, and request
//! nothing from the network. Requests are caught with a proxy: Chromium
//! is pointed at a listener on the loopback address that records every
//! connection, with no exception for any host, so a page that loads
//! anything over HTTP(S) is seen doing it; the control page with an
//! external `<img>` proves the check can fail. When the browser is
//! missing the tests say SKIPPED and pass, except under CI (`CI` set, as
//! `.ci/run` does), where they fail: scripts/test.sh installs it.

use std::io::Read;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{run_ok, skip_unless_ci, temp_dir};

const SAMPLE: &str = "crates/iocache-sim/data/sample.lis";
const BROWSERS: [&str; 2] = ["chromium-headless-shell", "chromium"];

/// The headless browser, or None after saying SKIPPED (failing under CI).
fn browser() -> Option<&'static str> {
    let found = BROWSERS.into_iter().find(|b| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        skip_unless_ci(&BROWSERS.join(" or "));
    }
    found
}

/// What the browser made of a page.
struct Loaded {
    dom: String,
    /// The first line of every request that reached the proxy.
    requests: Vec<String>,
    screenshot: Vec<u8>,
}

/// A listener on 127.0.0.1 that records what each connection sends first
/// and closes it, until dropped.
struct Proxy {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, done) = (requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                        let mut buf = [0u8; 1024];
                        let n = conn.read(&mut buf).unwrap_or(0);
                        let text = String::from_utf8_lossy(&buf[..n]);
                        let line = text.lines().next().unwrap_or("(connection, nothing sent)");
                        seen.lock().unwrap().push(line.to_string());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Proxy {
            port,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs the browser on `args` plus the URL of `page`, all traffic sent to
/// `proxy`; stdout, after at most 60 s.
fn run_browser(browser: &str, page: &Path, proxy: &Proxy, profile: &Path, args: &[&str]) -> Vec<u8> {
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--proxy-server=http://127.0.0.1:{}", proxy.port),
            // Not even loopback bypasses the proxy.
            "--proxy-bypass-list=<-loopback>",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the browser starts");
    let mut out = Vec::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{browser} {args:?} failed: {status}");
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{browser} {args:?} did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    reader.join().unwrap()
}

/// Loads `page` twice (the DOM, then a screenshot), recording requests.
fn load(browser: &str, page: &Path) -> Loaded {
    let proxy = Proxy::start();
    let dir = page.parent().unwrap();
    let name = page.file_stem().unwrap().to_string_lossy().into_owned();
    let dom = run_browser(
        browser,
        page,
        &proxy,
        &dir.join(format!("{name}.profile-dom")),
        &["--dump-dom"],
    );
    let shot = dir.join(format!("{name}.png"));
    run_browser(
        browser,
        page,
        &proxy,
        &dir.join(format!("{name}.profile-shot")),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,2400",
        ],
    );
    // A request still on its way when the browser exits has been sent.
    std::thread::sleep(Duration::from_millis(200));
    Loaded {
        dom: String::from_utf8_lossy(&dom).into_owned(),
        requests: proxy.requests(),
        screenshot: std::fs::read(&shot).unwrap_or_default(),
    }
}

/// The page's own text holds no URL a browser would fetch: only the SVG
/// namespace (an identifier), and no attribute or CSS that loads.
fn scan_self_contained(html: &str) -> Result<(), String> {
    let rest = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for needle in [
        "http://", "https://", "src=", "url(", "@import", "<link", "<script", "<iframe",
    ] {
        if rest.contains(needle) {
            return Err(format!("the page holds `{needle}`"));
        }
    }
    Ok(())
}

/// Everything a report page must pass in the browser: it parses with every
/// plot (`expect_svgs`, each with lines) and each name of `expect_text` in
/// the DOM, rasterizes, and requests nothing.
fn check_page(browser: &str, page: &Path, expect_svgs: usize, expect_text: &[&str]) {
    let html = std::fs::read_to_string(page).unwrap();
    scan_self_contained(&html).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
    assert_eq!(html.matches("<svg").count(), expect_svgs, "{}", page.display());
    let loaded = load(browser, page);
    assert!(
        loaded.requests.is_empty(),
        "{}: the browser requested {:?}",
        page.display(),
        loaded.requests
    );
    let dom = &loaded.dom;
    assert!(dom.contains("</html>"), "{}: no DOM dumped", page.display());
    assert_eq!(
        dom.matches("<svg").count(),
        expect_svgs,
        "{}: SVG elements in the DOM",
        page.display()
    );
    assert!(
        dom.matches("<polyline").count() >= expect_svgs,
        "{}: plot lines",
        page.display()
    );
    for text in expect_text {
        assert!(
            dom.contains(text),
            "{}: `{text}` is not in the DOM",
            page.display()
        );
    }
    // Rasterized: a PNG, and no blank one (a white page compresses to a
    // few KiB; plots and tables take tens).
    let png = &loaded.screenshot;
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "{}: no PNG screenshot",
        page.display()
    );
    assert!(
        png.len() > 30_000,
        "{}: the screenshot is {} B",
        page.display(),
        png.len()
    );
}

#[test]
fn lab_report_renders_offline() {
    let Some(browser) = browser() else { return };
    let dir = temp_dir("lab");
    let experiment = dir.join("e.toml");
    std::fs::write(
        &experiment,
        format!(
            "[[workload]]\nname = \"sample\"\ntrace = \"{}/{SAMPLE}\"\nformat = \"arc\"\n\n\
             [grid]\npolicy = [\"lru\", \"arc\"]\ncache_size = [\"64\", \"256\", \"1024\"]\n\
             write_policy = [\"wb\", \"wt\"]\n",
            env!("CARGO_MANIFEST_DIR")
        ),
    )
    .unwrap();
    let results = dir.join("e.results.jsonl");
    let e = experiment.to_str().unwrap();
    let r = results.to_str().unwrap();
    run_ok(&["lab", "run", e, "--out", r, "--threads", "1"]);
    run_ok(&["lab", "report", r]);
    let page = dir.join("e.results.html");
    // Hit, miss and byte hit ratio (no write-backs: the trace only reads).
    check_page(
        browser,
        &page,
        3,
        &[
            "sample: hit ratio vs cache size",
            "policy=lru write_policy=wb",
            "policy=arc write_policy=wt",
            "<table>",
        ],
    );
}

#[test]
fn sim_report_renders_offline() {
    let Some(browser) = browser() else { return };
    let dir = temp_dir("sim");
    // Reads and writes (the sample trace has only reads) over 20 s, in
    // MSR's CSV with Windows file times.
    let trace = dir.join("mixed.csv");
    let mut text = String::new();
    let mut x: u64 = 12345;
    for i in 0..2000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let kind = if i % 3 == 0 { "Write" } else { "Read" };
        let offset = ((x >> 33) % 2048) * 4096;
        text += &format!(
            "{},host,0,{kind},{offset},4096,0\n",
            128166372000000000 + i * 100_000
        );
    }
    std::fs::write(&trace, text).unwrap();
    let page = dir.join("sim.html");
    run_ok(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--format",
        "msr",
        "--policy",
        "lru,s3fifo",
        "--cache-size",
        "64,256,1024",
        "--timing",
        "--series-interval",
        "1s",
        "--report",
        page.to_str().unwrap(),
    ]);
    // 3 ratios against size, 2 latency CDFs, 6 time series.
    check_page(
        browser,
        &page,
        11,
        &[
            "hit ratio vs cache size",
            "read latency CDF",
            "IOPS over time",
            "s3fifo 1024",
        ],
    );
}

#[test]
fn mrc_report_renders_offline() {
    let Some(browser) = browser() else { return };
    let dir = temp_dir("mrc");
    let page = dir.join("mrc.html");
    run_ok(&[
        "trace",
        "mrc",
        SAMPLE,
        "--method",
        "exact,shards:0.5,opt",
        "--report",
        page.to_str().unwrap(),
    ]);
    check_page(
        browser,
        &page,
        2,
        &[
            "miss ratio curves: LRU and Belady's OPT",
            "shards:0.5 − exact",
            "opt",
        ],
    );
}

/// The checks can fail: a page with an external image is caught by the
/// scan, and the browser's request for it reaches the proxy.
#[test]
fn an_external_request_is_caught() {
    let Some(browser) = browser() else { return };
    let dir = temp_dir("control");
    let page = dir.join("external.html");
    std::fs::write(
        &page,
        "<!DOCTYPE html><html><body><p>control</p>\
         <img src=\"http://example.invalid/pixel.png\" alt=\"\"/></body></html>",
    )
    .unwrap();
    assert!(scan_self_contained(&std::fs::read_to_string(&page).unwrap()).is_err());
    let loaded = load(browser, &page);
    assert!(
        loaded
            .requests
            .iter()
            .any(|r| r.contains("example.invalid/pixel.png")),
        "the proxy saw {:?}",
        loaded.requests
    );
}
