//! A load balancer (LBICA, SIB: `iocache_core::balance`)
//! decides from what is queued at each device *now*, so the simulator must
//! be able to say, at any simulated time, how many I/Os each device holds
//! (waiting or in service) and, for the cache device, of which class: an
//! application read hit (R), an application write (W), a promotion (P) or
//! an eviction's read (E). The engine reports every I/O it schedules with
//! its completion time; an I/O is in the device from the time it reaches it
//! (its ready time, never later than the clock) until it completes.
//!
//! How an I/O's class is known from what the engine has: on the cache
//! device a read the client waits for is R, a read it does not wait for is
//! the first half of a write-back (E); a write the client waits for is W
//! (a write request's), one it does not is a fill (P). On the backend the
//! classes are just read (0) and write (1).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use iocache_core::balance::RequestClass;

use super::device::Dir;

/// The class of a cache-device I/O (see the module doc).
pub fn cache_class(dir: Dir, client_waits: bool) -> RequestClass {
    match (dir, client_waits) {
        (Dir::Read, true) => RequestClass::ReadHit,
        (Dir::Read, false) => RequestClass::Eviction,
        (Dir::Write, true) => RequestClass::Write,
        (Dir::Write, false) => RequestClass::Promotion,
    }
}

/// What one device holds at a given time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceQueue {
    /// I/Os by class (cache: `RequestClass as usize`; backend: 0 read, 1 write).
    pub by_class: [u64; 4],
}

impl DeviceQueue {
    pub fn total(&self) -> u64 {
        self.by_class.iter().sum()
    }
}

/// The I/Os in each device, by completion time.
#[derive(Debug, Default)]
pub struct QueueTracker {
    /// Per device, a min-heap of (completion time, class).
    ends: [BinaryHeap<Reverse<(u64, u8)>>; 2],
    now: [DeviceQueue; 2],
}

impl QueueTracker {
    /// An I/O of `class` entered `device` and completes at `end_ns`.
    pub fn add(&mut self, device: usize, class: u8, end_ns: u64) {
        self.ends[device].push(Reverse((end_ns, class)));
        self.now[device].by_class[class as usize] += 1;
    }

    /// What each device holds at `now_ns` (I/Os completing at `now_ns` are
    /// gone). Times must not decrease from call to call.
    pub fn at(&mut self, now_ns: u64) -> [DeviceQueue; 2] {
        for d in 0..2 {
            while let Some(&Reverse((end, class))) = self.ends[d].peek() {
                if end > now_ns {
                    break;
                }
                self.ends[d].pop();
                self.now[d].by_class[class as usize] -= 1;
            }
        }
        self.now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ios_leave_when_they_complete() {
        let mut q = QueueTracker::default();
        q.add(0, RequestClass::ReadHit as u8, 100);
        q.add(0, RequestClass::Promotion as u8, 300);
        q.add(1, 1, 200);
        let [c, b] = q.at(50);
        assert_eq!((c.by_class, b.total()), ([1, 0, 1, 0], 1));
        let [c, b] = q.at(200);
        assert_eq!((c.by_class, b.total()), ([0, 0, 1, 0], 0));
        assert_eq!(q.at(300)[0].total(), 0);
        assert_eq!(cache_class(Dir::Read, false), RequestClass::Eviction);
        assert_eq!(cache_class(Dir::Write, false), RequestClass::Promotion);
    }
}
