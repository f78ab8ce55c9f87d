//! `iocache stats` and `iocache ctl`: the clients of a running server's
//! admin socket (`iocache_serving::admin` answers it), and how their
//! replies are printed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use iocache_serving::stats::{RecaSnapshot, Snapshot};
use iocache_serving::stats_csv::{totals_csv, watch_rows, WatchRow};
use serde_json::{json, Value};

/// Sends one request and returns the reply, failing with the server's
/// error; when no server answers, says what to do in this program's words.
pub(crate) fn request(socket: &Path, line: &str, timeout: Option<Duration>) -> Result<Value> {
    use iocache_serving::admin_client::AdminError;
    iocache_serving::admin_client::request(socket, line, timeout).map_err(|e| {
        let way_out = match &e {
            AdminError::NoSuchSocket { .. } | AdminError::Stale { .. } => {
                "start it with `iocache serve`, or name the socket it uses with --admin-socket PATH"
            }
            AdminError::NotASocket { .. } | AdminError::NbdSocket { .. } => {
                "name the server's admin socket with --admin-socket PATH"
            }
            AdminError::PermissionDenied { .. } => {
                "run as the user that started the server, or one in its --socket-group"
            }
            _ => return anyhow::Error::new(e),
        };
        anyhow!("{e}; {way_out}")
    })
}

#[derive(Args)]
pub struct StatsArgs {
    /// The admin socket of a running `iocache serve`.
    #[arg(long, value_name = "PATH", default_value = "iocache-data/admin.sock")]
    admin_socket: PathBuf,
    /// Print the raw JSON.
    #[arg(long, conflicts_with_all = ["watch", "csv"])]
    json: bool,
    /// Every SECONDS (decimals allowed), print each volume's rates over the interval, as iostat
    /// does: requests and MiB per second, the line hit ratio, dirty and cached lines.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
    /// With --watch: stop after N intervals.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
    /// Print CSV (a header, then one row per volume; per interval with --watch).
    #[arg(long)]
    csv: bool,
}

/// `iocache stats`: asks a running server for its statistics.
pub fn stats(args: StatsArgs) -> Result<()> {
    let ask = || request(&args.admin_socket, "stats", Some(Duration::from_secs(10)));
    let Some(seconds) = args.watch else {
        let reply = ask()?;
        if args.csv {
            print!("{}", totals_csv(&snapshot_of(reply)?));
            return Ok(());
        }
        return print_reply(reply, args.json);
    };
    if !(seconds.is_finite() && (0.01..=86_400.0).contains(&seconds)) {
        bail!("--watch {seconds}: an interval of 0.01 to 86400 seconds");
    }
    let interval = Duration::from_secs_f64(seconds);
    let mut previous = snapshot_of(ask()?)?;
    let mut previous_at = Instant::now();
    if args.csv {
        println!("{}", WatchRow::CSV_HEADER);
    }
    let mut printed = 0u64;
    while args.count.is_none_or(|n| printed < n) {
        std::thread::sleep(interval);
        let now = snapshot_of(ask()?)?;
        let now_at = Instant::now();
        let rows = watch_rows(&previous, &now, now_at.duration_since(previous_at).as_secs_f64());
        if args.csv {
            for row in &rows {
                println!("{}", row.csv());
            }
        } else {
            print_watch(&rows, printed);
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        (previous, previous_at) = (now, now_at);
        printed += 1;
    }
    Ok(())
}

fn print_watch(rows: &[WatchRow], printed: u64) {
    if printed.is_multiple_of(20) {
        println!(
            "{:<8} {:<16} {:>9} {:>9} {:>9} {:>9} {:>7} {:>10} {:>10} {:>6}",
            "time(UTC)", "export", "r/s", "w/s", "rMiB/s", "wMiB/s", "hit%", "dirty", "cached", "failed"
        );
    }
    for r in rows {
        println!(
            "{:<8} {:<16} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>7} {:>10} {:>10} {:>6}",
            r.time,
            r.export,
            r.reads_per_second,
            r.writes_per_second,
            r.read_mib_per_second,
            r.write_mib_per_second,
            r.line_hit_ratio
                .map_or("-".to_string(), |h| format!("{:.2}", h * 100.0)),
            r.dirty_lines,
            r.resident_lines,
            r.failed_requests
        );
    }
}

/// A `stats` reply (or the JSON it printed) read back as the snapshot it is.
fn snapshot_of(reply: Value) -> Result<Snapshot> {
    serde_json::from_value(reply).context("the server's statistics are not in the form this program reads")
}

/// Prints a `stats` reply: as the JSON it is, or as the table.
fn print_reply(reply: Value, raw: bool) -> Result<()> {
    if raw {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else {
        print!("{}", iocache_serving::stats_text::render(&snapshot_of(reply)?));
    }
    Ok(())
}

#[derive(Args)]
pub struct CtlArgs {
    /// The admin socket of a running `iocache serve`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "iocache-data/admin.sock",
        global = true
    )]
    admin_socket: PathBuf,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Subcommand)]
enum CtlCommand {
    /// Add a volume to a cache device and serve it as a new export.
    Attach {
        /// The new export's name.
        export: String,
        /// Its backend: a file or block device, or nbd://host:port/name, nbd+unix:///name?socket=PATH.
        backend: String,
        /// Create a missing backend file with this size (sparse).
        #[arg(long, value_name = "SIZE")]
        backend_size: Option<String>,
        /// The cache device to share (needed when the server has several).
        #[arg(long, value_name = "PATH")]
        cache: Option<PathBuf>,
    },
    /// Stop serving an export: write back its dirty lines, drop its lines from the cache.
    Detach { export: String },
    /// Write back an export's dirty lines (it keeps serving).
    Flush { export: String },
    /// Put a new device in place of a cache-array member, while serving: a live member is
    /// retired first; the dirty lines that had a copy on it are written back, the array's
    /// metadata is copied to the new device (a missing file is created), and its line slots
    /// come back empty, filling again as lines are read. Then name NEW in the configuration's
    /// cache_array in place of OLD: the device it replaced is not trusted again.
    ReplaceMember {
        /// The member to replace, as the configuration names it.
        old: PathBuf,
        /// The new device or file.
        new: PathBuf,
        /// The cache array (needed when the server has several caches).
        #[arg(long, value_name = "PATH")]
        cache: Option<PathBuf>,
    },
    /// Read a range of an export through its cache in the background (as a client's
    /// NBD_CMD_CACHE does): lines come in as the promotion policy admits them on a read.
    /// Progress in `iocache stats`.
    Warm {
        export: String,
        /// Where to start (a size: 0, 4KiB, 1GiB) [default: 0].
        #[arg(long, value_name = "SIZE")]
        offset: Option<String>,
        /// How much to read [default: to the end of the volume].
        #[arg(long, value_name = "SIZE")]
        length: Option<String>,
    },
    /// Change knobs of a running cache (KEY=VALUE with the configuration file's keys:
    /// write_policy, promotion, policy, flush, write_miss_bypass, seq_cutoff, readahead, fill, max_dirty_lines).
    /// No cached or dirty line is lost; leaving wb/wo for a policy that keeps no dirty data
    /// writes the dirty lines back in the background. Changes survive restarts.
    Set {
        /// The export whose cache to change (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// KEY=VALUE, one or more.
        #[arg(required = true, value_name = "KEY=VALUE")]
        settings: Vec<String>,
    },
    /// Show the knobs of a running cache: configured and current values.
    Get {
        /// The export whose cache to show (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
    /// Reload ReCA's category table in a running server (serve --adapt reca): FILE, or the
    /// file in use. The category in force stays if the new table has it (with its new
    /// configuration); a table with errors is refused, naming the file, line and field.
    RecaReload {
        /// The export whose cache to change (needed when the server has several caches).
        #[arg(long, value_name = "NAME")]
        export: Option<String>,
        /// The new table (TOML, the fields of crates/iocache-core/data/reca-categories.toml).
        #[arg(long, value_name = "FILE")]
        table: Option<PathBuf>,
    },
    /// Show the statistics of every export, or of one.
    Stats {
        export: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Prints a cache's knobs: one line each, the current value and, when it
/// differs, the configured one; then the write policy in force.
fn print_settings(reply: &Value) {
    let volumes: Vec<&str> = reply["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    println!(
        "cache {} (volumes {})",
        reply["cache"].as_str().unwrap_or("?"),
        volumes.join(", ")
    );
    for k in reply["settings"].as_array().into_iter().flatten() {
        let current = k["current"].as_str().unwrap_or("?");
        let configured = k["configured"].as_str().unwrap_or("?");
        if current == configured {
            println!("  {:<18} {current}", k["key"].as_str().unwrap_or("?"));
        } else {
            println!(
                "  {:<18} {current} (configured {configured})",
                k["key"].as_str().unwrap_or("?")
            );
        }
    }
    println!(
        "  in force: {} write policy ({}); {} dirty lines",
        reply["effective_write_policy"].as_str().unwrap_or("?"),
        reply["effective_write_policy_cause"].as_str().unwrap_or("?"),
        reply["dirty_lines"]
    );
    if !reply["reca"].is_null() {
        match serde_json::from_value::<RecaSnapshot>(reply["reca"].clone()) {
            Ok(reca) => print!("{}", iocache_serving::stats_text::reca_status(&reca, "  ")),
            Err(e) => println!("  reca       (not readable: {e})"),
        }
    }
}

/// A path given to `ctl`, as the server (which may run elsewhere) must see it.
fn absolute(path: &str) -> Result<String> {
    if path.starts_with("nbd://") || path.starts_with("nbd+unix://") {
        return Ok(path.to_string());
    }
    Ok(std::path::absolute(path)
        .with_context(|| format!("resolving {path}"))?
        .display()
        .to_string())
}

/// `iocache ctl`: attach, detach, flush or show one volume of a running server.
pub fn ctl(args: CtlArgs) -> Result<()> {
    let socket = &args.admin_socket;
    // `req`, for `export` when one is named, answered within `seconds`
    // (or as long as it takes).
    let ask = |mut req: Value, export: Option<String>, seconds: Option<u64>| {
        if let Some(export) = export {
            req["export"] = json!(export);
        }
        request(socket, &req.to_string(), seconds.map(Duration::from_secs))
    };
    match args.command {
        CtlCommand::Attach {
            export,
            backend,
            backend_size,
            cache,
        } => {
            let mut req = json!({
                "command": "attach",
                "export": export,
                "backend": absolute(&backend)?,
            });
            if let Some(size) = backend_size {
                req["backend_size"] = json!(size);
            }
            if let Some(cache) = cache {
                req["cache"] = json!(absolute(&cache.display().to_string())?);
            }
            // The server names the request's fields; this command's are flags.
            let reply = ask(req, None, None).map_err(|e| {
                let text = format!("{e:#}");
                match text.strip_prefix("backend_size: ") {
                    Some(rest) => anyhow!("--backend-size: {rest}"),
                    None => e,
                }
            })?;
            println!(
                "attached export {} (volume {}, {} bytes over {}) to the cache {}",
                reply["export"], reply["volume_id"], reply["size_bytes"], reply["backend"], reply["cache"]
            );
        }
        CtlCommand::Detach { export } => {
            let reply = ask(json!({"command": "detach", "export": export}), None, None)?;
            println!(
                "detached export {}: its {} dirty lines are on its backend, its lines left the cache",
                reply["export"].as_str().unwrap_or("?"),
                reply["dirty_lines_written_back"]
            );
            if reply["exports_left"] == 0 {
                println!("the server serves no export now (`iocache ctl attach` adds one)");
            }
        }
        CtlCommand::Flush { export } => {
            let reply = ask(json!({"command": "flush", "export": export}), None, None)?;
            println!(
                "flushed export {}: {} written back",
                reply["export"],
                iocache_core::units::count(reply["written_back_lines"].as_u64().unwrap_or(0), "line")
            );
        }
        CtlCommand::ReplaceMember { old, new, cache } => {
            let mut req = json!({
                "command": "replace-member",
                "old": old.display().to_string(),
                "new": absolute(&new.display().to_string())?,
            });
            if let Some(cache) = cache {
                req["cache"] = json!(absolute(&cache.display().to_string())?);
            }
            let reply = ask(req, None, None)?;
            println!(
                "{} replaced {} in the cache array {}{}: {} lines and {} mirrors rebuilt from the other copies, \
                 {} line slots back in service, empty; name {} in the configuration's cache_array in place of {}",
                reply["new"].as_str().unwrap_or("?"),
                reply["old"].as_str().unwrap_or("?"),
                reply["cache"].as_str().unwrap_or("?"),
                if reply["retired"] == true {
                    " (retired first)"
                } else {
                    ""
                },
                reply["rebuilt_lines"],
                reply["rebuilt_mirrors"],
                reply["restored_slots"],
                reply["new"].as_str().unwrap_or("?"),
                reply["old"].as_str().unwrap_or("?"),
            );
        }
        CtlCommand::Warm {
            export,
            offset,
            length,
        } => {
            let size = |flag: &str, text: Option<String>| {
                text.map(|t| {
                    iocache_core::units::parse_byte_size(&t).map_err(|e| anyhow::anyhow!("--{flag}: {e}"))
                })
                .transpose()
            };
            let req = json!({
                "command": "warm",
                "export": export,
                "offset": size("offset", offset)?,
                "length": size("length", length)?,
            });
            let reply = ask(req, None, Some(30))?;
            println!(
                "warming export {}: {} at {} read through the cache in the background (progress: iocache stats)",
                reply["export"].as_str().unwrap_or("?"),
                iocache_core::units::format_size_readably(reply["length"].as_u64().unwrap_or(0)),
                reply["offset"]
            );
        }
        CtlCommand::Set { export, settings } => {
            let reply = ask(json!({"command": "set", "settings": settings}), export, Some(30))?;
            print_settings(&reply);
        }
        CtlCommand::Get { export, json } => {
            let reply = ask(json!({"command": "get"}), export, Some(10))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&reply)?);
            } else {
                print_settings(&reply);
            }
        }
        CtlCommand::RecaReload { export, table } => {
            let mut req = json!({"command": "reca-reload"});
            if let Some(table) = table {
                req["table"] = json!(absolute(&table.display().to_string())?);
            }
            let reply = ask(req, export, Some(30))?;
            println!(
                "reloaded ReCA's table from {} ({} categories)",
                reply["table"].as_str().unwrap_or("?"),
                reply["categories"].as_array().map_or(0, Vec::len)
            );
            print!(
                "{}",
                iocache_serving::stats_text::reca_status(
                    &serde_json::from_value::<RecaSnapshot>(reply)?,
                    "  "
                )
            );
        }
        CtlCommand::Stats { export, json } => {
            let reply = ask(json!({"command": "stats"}), export, Some(10))?;
            print_reply(reply, json)?;
        }
    }
    Ok(())
}
