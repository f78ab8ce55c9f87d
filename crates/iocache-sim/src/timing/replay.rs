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

use super::engine::TimingModel;
use super::TimingError;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ArrivalMode {
    /// Trace timestamps divided by `speed` (> 0).
    Open { speed: f64 },
    /// `outstanding` (≥ 1) requests in flight at all times.
    Closed { outstanding: u32 },
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
            ArrivalMode::Closed { outstanding: 0 } => {
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
    /// `trace_ns`. In a closed loop this runs `model` until fewer than `N`
    /// requests are in flight (recording their completions). Give the result
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
                while model.in_flight() >= outstanding as usize {
                    if model.next_completion().is_none() {
                        break;
                    }
                }
                model.now_ns()
            }
        }
    }
}
