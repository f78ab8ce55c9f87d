//! A one-line progress bar on stderr, shown only when stdout is a terminal.

use std::io::Write;
use std::time::{Duration, Instant};

use iocache_trace::TraceReader;

pub struct Bar {
    enabled: bool,
    started: Instant,
    last_draw: Option<Instant>,
    /// Shown before the bar (e.g. which workload of an experiment).
    label: String,
}

impl Bar {
    pub fn new(enabled: bool) -> Self {
        Bar {
            enabled,
            started: Instant::now(),
            last_draw: None,
            label: String::new(),
        }
    }

    /// A bar with `label` before it.
    pub fn labelled(enabled: bool, label: String) -> Self {
        Bar {
            label,
            ..Bar::new(enabled)
        }
    }

    pub fn update(&mut self, reader: &TraceReader, records: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if self
            .last_draw
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(200))
        {
            return;
        }
        self.last_draw = Some(now);
        let elapsed = now.duration_since(self.started).as_secs_f64();
        let mut line = self.label.clone();
        let mut eta = None;
        if let Some(total) = reader.input_len().filter(|&t| t > 0) {
            let fraction = (reader.input_bytes_consumed() as f64 / total as f64).min(1.0);
            let filled = (fraction * 30.0) as usize;
            line.push_str(&format!(
                "[{}{}] {:5.1} %",
                "#".repeat(filled),
                "-".repeat(30 - filled),
                fraction * 100.0
            ));
            if fraction > 0.01 {
                eta = Some(elapsed / fraction - elapsed);
            }
        }
        line.push_str(&format!("  {records} requests  {elapsed:.1} s"));
        if let Some(eta) = eta {
            line.push_str(&format!("  ETA {eta:.0} s"));
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    }

    pub fn finish(&mut self) {
        if self.enabled && self.last_draw.is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}
