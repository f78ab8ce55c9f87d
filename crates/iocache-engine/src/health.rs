//! Device health: error counters, the cache device's fall-back to
//! pass-through past an error threshold (and its return when the device
//! answers again), and the cleaner's back-off after failed write-backs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Cache-device errors after which the volume stops using the cache for new
/// data (pass-through) until the device answers again.
pub const CACHE_ERROR_THRESHOLD: u64 = 16;
/// How often a failed cache device is probed at first.
pub const CACHE_PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// The longest wait between probes: a device that passes the probe but
/// fails again soon after (a full file system, whose superblock blocks are
/// allocated) is probed less and less often, up to this.
pub const CACHE_PROBE_INTERVAL_MAX: Duration = Duration::from_secs(64);
/// Failing again within this time of a recovery counts as a relapse.
pub const RELAPSE_WINDOW: Duration = Duration::from_secs(30);
/// At most one log line about backend errors per this interval (the first
/// error is logged at once; the next line counts those in between).
pub const BACKEND_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// First and longest wait before the cleaner retries failed write-backs.
pub const RETRY_MIN: Duration = Duration::from_millis(10);
pub const RETRY_MAX: Duration = Duration::from_secs(5);

#[derive(Default)]
pub struct Health {
    pub cache_errors: AtomicU64,
    pub backend_errors: AtomicU64,
    /// Write-backs (of cleaner batches and flushes) that failed and were
    /// left dirty for a retry.
    pub failed_writebacks: AtomicU64,
    /// Past the threshold: the cores are told the cache device failed
    /// (`Cache::set_cache_device_failed`: pass-through) until a probe passes.
    pub cache_failed: AtomicBool,
    retry: Mutex<Retry>,
    /// Backend errors since the last log line about them.
    backend_errors_unreported: AtomicU64,
    /// When that line was written (engine clock, ns; 0: never).
    backend_logged_at_ns: AtomicU64,
}

#[derive(Default)]
struct Retry {
    /// No cleaning before this time (engine clock, ns).
    not_before_ns: u64,
    delay_ns: u64,
    /// Next probe of a failed cache device.
    next_probe_ns: u64,
    /// Current wait between probes (0: the initial one).
    probe_interval_ns: u64,
    /// When the device last recovered (for relapses).
    recovered_at_ns: Option<u64>,
}

impl Health {
    /// Counts a cache-device error at `now_ns`; true when this one crosses
    /// the threshold. Crossing it again soon after a recovery doubles the
    /// time to the next probe.
    pub fn cache_error(&self, now_ns: u64) -> bool {
        let errors = self.cache_errors.fetch_add(1, Ordering::Relaxed) + 1;
        errors >= CACHE_ERROR_THRESHOLD && self.fail_cache(now_ns)
    }

    /// Counts a cache-device error that fails the device at once (a flush
    /// that failed: nothing written since the last one is known durable);
    /// true when the device was not failed before.
    pub fn cache_failed_now(&self, now_ns: u64) -> bool {
        self.cache_errors.fetch_add(1, Ordering::Relaxed);
        self.fail_cache(now_ns)
    }

    /// Marks the cache device failed at `now_ns` and schedules its first
    /// probe; true when it was not failed before.
    fn fail_cache(&self, now_ns: u64) -> bool {
        if self.cache_failed.swap(true, Ordering::SeqCst) {
            return false;
        }
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        let initial = CACHE_PROBE_INTERVAL.as_nanos() as u64;
        let relapse = retry
            .recovered_at_ns
            .is_some_and(|at| now_ns.saturating_sub(at) < RELAPSE_WINDOW.as_nanos() as u64);
        retry.probe_interval_ns = if relapse {
            (retry.probe_interval_ns.max(initial) * 2).min(CACHE_PROBE_INTERVAL_MAX.as_nanos() as u64)
        } else {
            initial
        };
        retry.next_probe_ns = now_ns + retry.probe_interval_ns;
        true
    }

    /// Counts a backend error at `now_ns`; returns how many errors to
    /// report in a log line now (this one and those not reported yet), or
    /// `None` while the last line is younger than [`BACKEND_LOG_INTERVAL`].
    pub fn backend_error(&self, now_ns: u64) -> Option<u64> {
        self.backend_errors.fetch_add(1, Ordering::Relaxed);
        self.backend_errors_unreported.fetch_add(1, Ordering::Relaxed);
        let last = self.backend_logged_at_ns.load(Ordering::Relaxed);
        let due = last == 0 || now_ns.saturating_sub(last) >= BACKEND_LOG_INTERVAL.as_nanos() as u64;
        if due
            && self
                .backend_logged_at_ns
                .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.backend_errors_unreported.swap(0, Ordering::Relaxed));
        }
        None
    }

    /// Whether the cleaner may try now (not backing off).
    pub fn may_clean(&self, now_ns: u64) -> bool {
        now_ns >= self.retry.lock().unwrap_or_else(|p| p.into_inner()).not_before_ns
    }

    /// A cleaning attempt wrote `failed` lines back unsuccessfully: back off
    /// exponentially; a fully successful one resets the back-off.
    pub fn cleaned(&self, now_ns: u64, failed: usize) {
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        if failed == 0 {
            retry.delay_ns = 0;
            retry.not_before_ns = 0;
            return;
        }
        self.failed_writebacks.fetch_add(failed as u64, Ordering::Relaxed);
        retry.delay_ns = (retry.delay_ns * 2).clamp(RETRY_MIN.as_nanos() as u64, RETRY_MAX.as_nanos() as u64);
        retry.not_before_ns = now_ns + retry.delay_ns;
    }

    /// Whether a failed cache device is due for a probe (and books the next).
    pub fn probe_due(&self, now_ns: u64) -> bool {
        if !self.cache_failed.load(Ordering::Relaxed) {
            return false;
        }
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        if now_ns < retry.next_probe_ns {
            return false;
        }
        retry.next_probe_ns = now_ns
            + retry
                .probe_interval_ns
                .max(CACHE_PROBE_INTERVAL.as_nanos() as u64);
        true
    }

    /// The cache device answered a probe at `now_ns`: back to normal.
    pub fn cache_recovered(&self, now_ns: u64) {
        self.retry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .recovered_at_ns = Some(now_ns);
        self.cache_errors.store(0, Ordering::Relaxed);
        self.cache_failed.store(false, Ordering::SeqCst);
    }

    /// The wait before the next probe (for tests and statistics).
    #[cfg(test)]
    fn probe_interval_ns(&self) -> u64 {
        self.retry.lock().unwrap().probe_interval_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_are_logged_once_per_interval_with_their_count() {
        let h = Health::default();
        let s = 1_000_000_000;
        assert_eq!(h.backend_error(5 * s), Some(1), "the first at once");
        for i in 0..99 {
            assert_eq!(h.backend_error(5 * s + i), None);
        }
        assert_eq!(h.backend_error(16 * s), Some(100), "then the count since");
        assert_eq!(h.backend_error(17 * s), None);
        assert_eq!(h.backend_errors.load(Ordering::Relaxed), 102);
    }

    #[test]
    fn a_failed_flush_fails_the_device_at_once() {
        let h = Health::default();
        assert!(h.cache_failed_now(1));
        assert!(h.cache_failed.load(Ordering::SeqCst));
        assert!(!h.cache_failed_now(2), "once");
        assert_eq!(h.cache_errors.load(Ordering::Relaxed), 2, "each counted once");
    }

    #[test]
    fn threshold_is_crossed_once() {
        let h = Health::default();
        let crossings = (0..3 * CACHE_ERROR_THRESHOLD)
            .filter(|_| h.cache_error(0))
            .count();
        assert_eq!(crossings, 1);
        assert!(h.cache_failed.load(Ordering::SeqCst));
        h.cache_recovered(0);
        assert!(!h.cache_failed.load(Ordering::SeqCst));
        let crossings = (0..CACHE_ERROR_THRESHOLD).filter(|_| h.cache_error(0)).count();
        assert_eq!(crossings, 1, "a recovered device can fail again");
    }

    #[test]
    fn a_device_that_relapses_is_probed_less_often() {
        let h = Health::default();
        let second = 1_000_000_000u64;
        let fail = |now| {
            for _ in 0..CACHE_ERROR_THRESHOLD {
                h.cache_error(now);
            }
        };
        let mut now = 0;
        fail(now);
        assert_eq!(h.probe_interval_ns(), 2 * second);
        let mut waits = Vec::new();
        for _ in 0..8 {
            // Probe when due, recover, fail again a second later.
            now += h.probe_interval_ns();
            assert!(h.probe_due(now));
            h.cache_recovered(now);
            now += second;
            fail(now);
            waits.push(h.probe_interval_ns() / second);
        }
        assert_eq!(waits, vec![4, 8, 16, 32, 64, 64, 64, 64]);
        // Failing long after a recovery starts over.
        now += h.probe_interval_ns();
        assert!(h.probe_due(now));
        h.cache_recovered(now);
        fail(now + 60 * second);
        assert_eq!(h.probe_interval_ns(), 2 * second);
    }

    #[test]
    fn back_off_doubles_up_to_the_limit_and_resets() {
        let h = Health::default();
        let mut now = 1_000;
        let mut last_wait = 0;
        for _ in 0..20 {
            h.cleaned(now, 1);
            assert!(!h.may_clean(now));
            let wait = h.retry.lock().unwrap().not_before_ns - now;
            assert!(wait >= last_wait && wait <= RETRY_MAX.as_nanos() as u64);
            last_wait = wait;
            now += wait;
            assert!(h.may_clean(now));
        }
        assert_eq!(last_wait, RETRY_MAX.as_nanos() as u64);
        h.cleaned(now, 0);
        assert!(h.may_clean(now));
        assert_eq!(h.failed_writebacks.load(Ordering::Relaxed), 20);
    }
}
