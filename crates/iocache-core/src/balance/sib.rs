//! SIB (Kim, Roh, Park, "Selective I/O Bypass and Load
//! Balancing Method for Write-Through SSD Caching in Big Data Analytics",
//! IEEE TC 67(4), 2018) is the baseline LBICA is measured against. The SIB
//! paper itself is not in the project's paper set; this follows the LBICA
//! paper's account of it (DATE'19 §I-II): a write-through or write-only
//! cache whose policy never changes, where the wait of each queued request
//! is estimated and the requests with the highest estimates are served by
//! the disk instead.
//!
//! In a FIFO queue the requests with the highest estimated waits are those
//! that join it last, so SIB here asks, for every arriving request, whether
//! it would complete sooner at the backend (behind the backend's queue)
//! than at the cache (behind the cache's), and bypasses it if so: the same
//! test LBICA's tail bypass uses (`balance::backend_is_faster`, scaled by
//! `margin`), with the same queue measurements, but always on and with no
//! change of write policy. The cache refuses the bypass of a request with
//! dirty sectors (possible under WO), as for LBICA.

use crate::balance::{bypass_with_margin, Action, Balancer, Decision, DeviceLoad, IntervalInputs};

/// SIB's knob.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SibConfig {
    /// A request is bypassed when its estimated response at the cache
    /// exceeds `margin ×` its estimate at the backend.
    pub margin: f64,
}

impl Default for SibConfig {
    fn default() -> Self {
        SibConfig { margin: 1.0 }
    }
}

/// The SIB controller.
#[derive(Clone, Debug)]
pub struct Sib {
    config: SibConfig,
}

impl Sib {
    pub fn new(config: SibConfig) -> Sib {
        Sib { config }
    }
}

impl Balancer for Sib {
    fn name(&self) -> &'static str {
        "sib"
    }

    /// SIB decides per request only; the interval's event reports the same
    /// measurements LBICA's does (the group for comparison, not acted on).
    fn on_interval(&mut self, inputs: &IntervalInputs) -> Decision {
        Decision::observed(inputs, self.action())
    }

    fn action(&self) -> Action {
        Action {
            policy: None,
            bypass: true,
        }
    }

    fn bypass(&self, cache_now: &DeviceLoad, backend_now: &DeviceLoad) -> bool {
        bypass_with_margin(self.config.margin, cache_now, backend_now)
    }

    fn bypass_margin(&self) -> Option<f64> {
        Some(self.config.margin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balance::QueueMix;

    #[test]
    fn bypasses_the_requests_that_would_wait_longest() {
        let sib = Sib::new(SibConfig::default());
        let backend = DeviceLoad {
            queued: 2.0,
            per_request_ns: 1_000_000.0,
            service_ns: 1_000_000.0,
        };
        // Backend: 2 ms queued + 1 ms. Cache at 10 µs a request, 50 µs alone.
        let cache = |queued| DeviceLoad {
            queued,
            per_request_ns: 10_000.0,
            service_ns: 50_000.0,
        };
        assert!(!sib.bypass(&cache(295.0), &backend));
        assert!(sib.bypass(&cache(296.0), &backend));
        let cautious = Sib::new(SibConfig { margin: 2.0 });
        assert!(!cautious.bypass(&cache(296.0), &backend));
        assert!(cautious.bypass(&cache(596.0), &backend));
        // The margin a driver evaluates itself gives the same answers.
        for q in [0.0, 295.0, 296.0, 595.0, 596.0] {
            let m = cautious.bypass_margin().unwrap();
            assert_eq!(
                bypass_with_margin(m, &cache(q), &backend),
                cautious.bypass(&cache(q), &backend)
            );
        }
    }

    #[test]
    fn the_interval_event_never_changes_the_policy() {
        let mut sib = Sib::new(SibConfig::default());
        let d = sib.on_interval(&IntervalInputs {
            cache: DeviceLoad {
                queued: 100.0,
                per_request_ns: 10.0,
                service_ns: 10.0,
            },
            cache_mix: QueueMix::new(44.0, 2.2, 51.0, 2.8),
            ..IntervalInputs::default()
        });
        assert!(d.bottleneck && !d.changed);
        assert_eq!(d.action.policy, None);
        assert_eq!(d.cache_queue_time_ns, 1000.0);
    }
}
