//! A cheap monotonic clock for the request path. Every request reads the time
//! twice (its start, passed to the policy core, and its end, for the latency
//! histogram); through the vDSO that costs tens of nanoseconds per read in a
//! VM, a visible share of a 1-2 µs cache hit. Where the CPU's time-stamp
//! counter is invariant (constant rate, not stopped in idle states: the
//! `constant_tsc` and `nonstop_tsc` flags), the counter is read directly and
//! converted with a rate calibrated once per process against `Instant`;
//! elsewhere `Instant` is used.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Calibration window: long enough that its error (a few tens of ns of
/// jitter at each end) is a few parts per million of the rate.
const CALIBRATION: Duration = Duration::from_millis(10);

#[derive(Clone, Copy, Debug)]
struct TscRate {
    /// Nanoseconds per tick, as a 32.32 fixed-point number.
    ns_per_tick_q32: u64,
}

fn tsc_rate() -> Option<TscRate> {
    static RATE: OnceLock<Option<TscRate>> = OnceLock::new();
    *RATE.get_or_init(calibrate)
}

#[cfg(target_arch = "x86_64")]
fn read_tsc() -> u64 {
    // SAFETY: `rdtsc` has no preconditions on x86_64; it only reads a counter.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(target_arch = "x86_64")]
fn calibrate() -> Option<TscRate> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = cpuinfo.lines().find(|l| l.starts_with("flags"))?;
    let has = |flag: &str| flags.split_whitespace().any(|f| f == flag);
    if !(has("constant_tsc") && has("nonstop_tsc")) {
        return None;
    }
    let (start, start_tsc) = (Instant::now(), read_tsc());
    std::thread::sleep(CALIBRATION);
    let (end, end_tsc) = (Instant::now(), read_tsc());
    let ticks = end_tsc.checked_sub(start_tsc)?;
    let nanos = end.duration_since(start).as_nanos();
    if ticks < 1000 || nanos == 0 {
        return None;
    }
    let ns_per_tick_q32 = u64::try_from((nanos << 32) / u128::from(ticks)).ok()?;
    // Sanity: a counter between 10 MHz and 100 GHz.
    if !(ns_per_tick_q32 > (1u64 << 32) / 100 && ns_per_tick_q32 < (100u64 << 32)) {
        return None;
    }
    Some(TscRate { ns_per_tick_q32 })
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    0
}

#[cfg(not(target_arch = "x86_64"))]
fn calibrate() -> Option<TscRate> {
    None
}

/// Nanoseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
    origin_tsc: u64,
    rate: Option<TscRate>,
}

impl Clock {
    pub fn new() -> Clock {
        let rate = tsc_rate();
        Clock {
            origin: Instant::now(),
            origin_tsc: if rate.is_some() { read_tsc() } else { 0 },
            rate,
        }
    }

    /// Whether the time-stamp counter is used.
    #[cfg(test)]
    pub fn uses_tsc(&self) -> bool {
        self.rate.is_some()
    }

    /// Nanoseconds since the clock was made; never decreases within a
    /// thread (a counter read on another core may lag by a few ticks, which
    /// callers tolerate: latencies saturate at zero).
    #[inline]
    pub fn now_ns(&self) -> u64 {
        match self.rate {
            Some(rate) => {
                let ticks = read_tsc().saturating_sub(self.origin_tsc);
                ((u128::from(ticks) * u128::from(rate.ns_per_tick_q32)) >> 32) as u64
            }
            None => self.origin.elapsed().as_nanos() as u64,
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_system_clock() {
        let clock = Clock::new();
        let (a, started) = (clock.now_ns(), Instant::now());
        std::thread::sleep(Duration::from_millis(30));
        let (b, elapsed) = (clock.now_ns(), started.elapsed().as_nanos() as u64);
        let measured = b - a;
        // Within 2 % of the system clock over 30 ms (sleep jitter aside, the
        // calibrated rate is far closer than this).
        assert!(
            measured.abs_diff(elapsed) < elapsed / 50 + 200_000,
            "clock says {measured} ns, system clock {elapsed} ns (tsc: {})",
            clock.uses_tsc()
        );
    }

    #[test]
    fn never_goes_back_within_a_thread() {
        let clock = Clock::new();
        let mut last = clock.now_ns();
        for _ in 0..100_000 {
            let now = clock.now_ns();
            assert!(now >= last, "{now} after {last}");
            last = now;
        }
    }
}
