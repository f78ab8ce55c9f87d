//! Arrival processes: when each trace request reaches the timing model.
//!
//! - **Open loop** ([`ArrivalMode::Open`]): requests arrive at their trace
//!   timestamps, measured from the first one and divided by a speed factor
//!   (SYSTOR'14 §6.1 replays at 20× this way). Arrivals do not depend on
//!   completions, so queues grow without bound when the devices cannot keep up.
//! - **Closed loop** ([`ArrivalMode::Closed`]): `N` requests are outstanding at
//!   all times; a new one is issued the moment one completes, ignoring the
//!   trace's timestamps (the fio/benchmark setting of ASPLOS'23 §4, "32
//!   threads at maximum speed").
//! - **Bounded clients** ([`ArrivalMode::Clients`]): trace timestamps as in
//!   the open loop, but at most `N` requests outstanding; a request whose
//!   time has come waits for one to complete (a server application with `N`
//!   threads: bursts still arrive, but queues stop growing at `N`). Its
//!   latency is measured from when it is issued.

use super::engine::TimingModel;
use super::TimingError;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrivalMode {
    /// Trace timestamps divided by `speed` (> 0).
    Open { speed: f64 },
    /// `outstanding` (≥ 1) requests in flight at all times.
    Closed { outstanding: u32 },
    /// Trace timestamps divided by `speed` (> 0), with at most
    /// `outstanding` (≥ 1) requests in flight.
    Clients { speed: f64, outstanding: u32 },
}

/// Runs `model` until fewer than `outstanding` requests are in flight.
fn wait_for_a_client(model: &mut TimingModel, outstanding: u32) {
    while model.in_flight() >= outstanding as usize {
        if model.next_completion().is_none() {
            break;
        }
    }
}

/// Computes arrival times for a stream of trace requests.
#[derive(Clone, Debug)]
pub struct Replay {
    mode: ArrivalMode,
    origin: Option<u64>,
}

impl Replay {
    pub fn new(mode: ArrivalMode) -> Result<Self, TimingError> {
        match mode {
            ArrivalMode::Open { speed } if !(speed.is_finite() && speed > 0.0) => {
                return Err(TimingError::BadParameter(format!(
                    "speed must be positive, not {speed}"
                )))
            }
            ArrivalMode::Clients { speed, .. } if !(speed.is_finite() && speed > 0.0) => {
                return Err(TimingError::BadParameter(format!(
                    "speed must be positive, not {speed}"
                )))
            }
            ArrivalMode::Closed { outstanding: 0 } | ArrivalMode::Clients { outstanding: 0, .. } => {
                return Err(TimingError::BadParameter(
                    "closed loop needs at least 1 outstanding request".into(),
                ))
            }
            _ => {}
        }
        Ok(Replay { mode, origin: None })
    }

    pub fn mode(&self) -> ArrivalMode {
        self.mode
    }

    /// The arrival time of the next request, whose trace timestamp is
    /// `trace_ns`. In a closed loop, and with bounded clients, this runs
    /// `model` until fewer than `N` requests are in flight (recording their
    /// completions). Give the result
    /// to the cache as the request's `now_ns` and to [`TimingModel::submit`].
    pub fn next_arrival(&mut self, model: &mut TimingModel, trace_ns: u64) -> u64 {
        match self.mode {
            ArrivalMode::Open { speed } => {
                let origin = *self.origin.get_or_insert(trace_ns);
                let t = (trace_ns.saturating_sub(origin) as f64 / speed).round() as u64;
                // Never before the model's clock (unsorted traces).
                t.max(model.now_ns())
            }
            ArrivalMode::Closed { outstanding } => {
                wait_for_a_client(model, outstanding);
                model.now_ns()
            }
            ArrivalMode::Clients { speed, outstanding } => {
                let origin = *self.origin.get_or_insert(trace_ns);
                let t = (trace_ns.saturating_sub(origin) as f64 / speed).round() as u64;
                // Completions after `t` are processed only while all clients
                // are busy: the request is issued when the first one ends.
                wait_for_a_client(model, outstanding);
                t.max(model.now_ns())
            }
        }
    }
}
