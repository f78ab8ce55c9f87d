//! A load balancer (LBICA, SIB: `iocache_core::
//! balance`) decides from how much work waits at the cache device and at
//! the backend, and of which kind (LBICA's R/W/P/E mix), so the engine must
//! count the I/Os it has issued and not yet seen complete on each device,
//! by class, and how long they take. Every cache-device and backend I/O of
//! the request path and of the cleaner goes through [`DeviceQueue::time`].
//!
//! The request path pays a few relaxed atomic adds on counters of its own
//! thread stripe (`stripe.rs`: one shared counter cost a third of the
//! two-thread hit rate) and two clock reads; no lock. The readers (stats,
//! the controller in `balance.rs`) add the stripes up. Counters are
//! cumulative, so two snapshots give an interval's figures without anyone
//! resetting anything, except the smallest latency seen, which the
//! controller takes (and resets) once per interval.
//!
//! What an interval's snapshots give (`balance.rs`): by Little's law the
//! mean number of I/Os in the device over the interval is the sum of the
//! latencies of the I/Os that completed in it divided by its length (an
//! I/O longer than the interval counts when it completes); the device's
//! completion rate gives the time per queued request.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use crate::clock::Clock;
use crate::stripe::{stripe, Padded, STRIPES};

/// The classes of cache-device I/O (LBICA's R, W, P, E), indices into
/// [`DeviceQueue`]'s counters, in `RequestClass` order.
pub(super) mod cache_class {
    /// A client read served from the cache (a hit).
    pub const READ_HIT: usize = 0;
    /// A client write stored in the cache.
    pub const WRITE: usize = 1;
    /// A missed read's data written into the cache (promotion, fill).
    pub const PROMOTION: usize = 2;
    /// Dirty data read from the cache to be written back (eviction,
    /// cleaning, flush).
    pub const EVICTION: usize = 3;
    pub const NAMES: [&str; 4] = ["R", "W", "P", "E"];
}

/// The classes of backend I/O.
pub(super) mod backend_class {
    /// A client read served by the backend (a miss, a bypass).
    pub const READ: usize = 0;
    /// A client write sent to the backend (write-through, -around, a bypass).
    pub const WRITE: usize = 1;
    /// Dirty data written back from the cache.
    pub const WRITE_BACK: usize = 2;
    pub const NAMES: [&str; 3] = ["read", "write", "writeback"];
}

/// One thread stripe's counters of one device.
struct Stripe<const N: usize> {
    /// I/Os issued and not completed by this stripe's threads.
    in_flight: AtomicI64,
    issued: [AtomicU64; N],
    completed: [AtomicU64; N],
    /// The sum of the completed I/Os' latencies.
    latency_ns: [AtomicU64; N],
    /// The smallest latency since the controller last took it (0: none).
    min_latency_ns: AtomicU64,
}

impl<const N: usize> Default for Stripe<N> {
    fn default() -> Self {
        Stripe {
            in_flight: AtomicI64::new(0),
            issued: std::array::from_fn(|_| AtomicU64::new(0)),
            completed: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_ns: std::array::from_fn(|_| AtomicU64::new(0)),
            min_latency_ns: AtomicU64::new(0),
        }
    }
}

/// One device's I/O accounting, by class (see the module doc).
pub(super) struct DeviceQueue<const N: usize> {
    stripes: [Padded<Stripe<N>>; STRIPES],
}

impl<const N: usize> Default for DeviceQueue<N> {
    fn default() -> Self {
        DeviceQueue {
            stripes: std::array::from_fn(|_| Padded(Stripe::default())),
        }
    }
}

/// Cumulative counters of one device, summed over the stripes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueueSnapshot<const N: usize> {
    pub issued: [u64; N],
    pub completed: [u64; N],
    pub latency_ns: [u64; N],
}

impl<const N: usize> Default for QueueSnapshot<N> {
    fn default() -> Self {
        QueueSnapshot {
            issued: [0; N],
            completed: [0; N],
            latency_ns: [0; N],
        }
    }
}

impl<const N: usize> QueueSnapshot<N> {
    /// The counts of the interval from `earlier` to this one.
    pub fn since(&self, earlier: &QueueSnapshot<N>) -> QueueSnapshot<N> {
        let d = |a: &[u64; N], b: &[u64; N]| std::array::from_fn(|i| a[i].saturating_sub(b[i]));
        QueueSnapshot {
            issued: d(&self.issued, &earlier.issued),
            completed: d(&self.completed, &earlier.completed),
            latency_ns: d(&self.latency_ns, &earlier.latency_ns),
        }
    }
}

impl<const N: usize> DeviceQueue<N> {
    /// Runs one I/O of `class` (`io`), counted and timed.
    #[inline]
    pub fn time<T>(&self, clock: &Clock, class: usize, io: impl FnOnce() -> T) -> T {
        self.time_n(clock, class, 1, io)
    }

    /// Runs `n` I/Os of `class` issued together (a batch), counted and
    /// timed: each takes the batch's time.
    #[inline]
    pub fn time_n<T>(&self, clock: &Clock, class: usize, n: u64, io: impl FnOnce() -> T) -> T {
        let s = &self.stripes[stripe()].0;
        s.in_flight.fetch_add(n as i64, Ordering::Relaxed);
        s.issued[class].fetch_add(n, Ordering::Relaxed);
        let started_ns = clock.now_ns();
        let out = io();
        let took_ns = clock.now_ns().saturating_sub(started_ns).max(1);
        s.completed[class].fetch_add(n, Ordering::Relaxed);
        s.latency_ns[class].fetch_add(took_ns * n, Ordering::Relaxed);
        s.in_flight.fetch_sub(n as i64, Ordering::Relaxed);
        let min = s.min_latency_ns.load(Ordering::Relaxed);
        if min == 0 || took_ns < min {
            // A race with another thread of the stripe loses a sample at
            // worst.
            s.min_latency_ns.store(took_ns, Ordering::Relaxed);
        }
        out
    }

    /// I/Os issued and not completed now.
    #[inline]
    pub fn in_flight(&self) -> u64 {
        let sum: i64 = self
            .stripes
            .iter()
            .map(|s| s.in_flight.load(Ordering::Relaxed))
            .sum();
        sum.max(0) as u64
    }

    pub fn snapshot(&self) -> QueueSnapshot<N> {
        let mut snap = QueueSnapshot::default();
        for s in &self.stripes {
            for c in 0..N {
                snap.issued[c] += s.issued[c].load(Ordering::Relaxed);
                snap.completed[c] += s.completed[c].load(Ordering::Relaxed);
                snap.latency_ns[c] += s.latency_ns[c].load(Ordering::Relaxed);
            }
        }
        snap
    }

    /// The smallest latency of an I/O completed since the last call.
    pub fn take_min_latency_ns(&self) -> Option<u64> {
        self.stripes
            .iter()
            .map(|s| s.min_latency_ns.swap(0, Ordering::Relaxed))
            .filter(|&ns| ns > 0)
            .min()
    }

    /// The public view: per class, and the total in flight.
    pub fn stats(&self, names: &[&'static str; N]) -> DeviceQueueStats {
        let snap = self.snapshot();
        DeviceQueueStats {
            in_flight: self.in_flight(),
            classes: (0..N)
                .map(|c| QueueClassStats {
                    class: names[c],
                    issued: snap.issued[c],
                    completed: snap.completed[c],
                    in_flight: snap.issued[c].saturating_sub(snap.completed[c]),
                    latency_ns_total: snap.latency_ns[c],
                })
                .collect(),
        }
    }
}

/// The I/O the engine has issued to one device (`EngineStats::cache_queue`,
/// `backend_queue`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceQueueStats {
    /// I/Os issued and not completed now.
    pub in_flight: u64,
    /// By class: the cache device's R, W, P and E; the backends' read,
    /// write and writeback.
    pub classes: Vec<QueueClassStats>,
}

/// One class of I/O on one device, since the engine started.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueClassStats {
    pub class: &'static str,
    pub issued: u64,
    pub completed: u64,
    /// Issued and not completed now (read apart from `issued` and
    /// `completed`, so possibly off by the I/Os of that instant).
    pub in_flight: u64,
    /// The sum of the completed I/Os' latencies.
    pub latency_ns_total: u64,
}

impl QueueClassStats {
    /// The mean latency of the completed I/Os (0 with none).
    pub fn mean_latency_ns(&self) -> u64 {
        self.latency_ns_total.checked_div(self.completed).unwrap_or(0)
    }
}

/// The engine's accounting of both sides.
#[derive(Default)]
pub(super) struct Queues {
    pub cache: DeviceQueue<4>,
    /// Every backend together (volumes sharing a cache count as one).
    pub backend: DeviceQueue<3>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_time_and_in_flight() {
        let clock = Clock::new();
        let q = DeviceQueue::<4>::default();
        q.time(&clock, cache_class::READ_HIT, || {
            assert_eq!(q.in_flight(), 1);
            std::thread::sleep(std::time::Duration::from_millis(2));
        });
        q.time_n(&clock, cache_class::WRITE, 3, || assert_eq!(q.in_flight(), 3));
        assert_eq!(q.in_flight(), 0);
        let s = q.snapshot();
        assert_eq!(s.issued, [1, 3, 0, 0]);
        assert_eq!(s.completed, [1, 3, 0, 0]);
        assert!(s.latency_ns[0] >= 2_000_000, "{s:?}");
        let min = q.take_min_latency_ns().unwrap();
        assert!(min < 2_000_000, "{min}");
        assert_eq!(q.take_min_latency_ns(), None);
        let later = {
            q.time(&clock, cache_class::EVICTION, || ());
            q.snapshot()
        };
        assert_eq!(later.since(&s).completed, [0, 0, 0, 1]);
        let stats = q.stats(&cache_class::NAMES);
        assert_eq!(stats.classes[1].completed, 3);
        assert_eq!(stats.classes[3].class, "E");
        assert!(stats.classes[0].mean_latency_ns() >= 2_000_000);
    }

    #[test]
    fn threads_on_other_stripes_add_up() {
        let clock = Clock::new();
        let q = DeviceQueue::<3>::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..100 {
                        q.time(&clock, backend_class::WRITE_BACK, || ());
                    }
                });
            }
        });
        assert_eq!(q.snapshot().completed, [0, 0, 400]);
        assert_eq!(q.in_flight(), 0);
    }
}
