//! Payload memory: the budget of one connection and the two pools all
//! connections share (small and large requests), handed out first come,
//! first served.

use super::*;

/// Requests at most this big draw from the small requests' share of the
/// shared budget (see [`GlobalBudget`]).
pub const SMALL_REQUEST_BYTES: usize = 128 << 10;

/// The payload budget all connections share, in two pools, each handed
/// out in the order it was asked for (a ticket queue, so a request waiting
/// for many bytes is not overtaken forever by smaller ones):
///
/// - the small pool, an eighth of the budget (but never so much that the
///   rest cannot hold one request of `max_payload`), for requests of at
///   most [`SMALL_REQUEST_BYTES`];
/// - the large pool, the rest, for larger requests.
///
/// So clients that pin large requests (32 MiB reads whose replies they
/// never read) cannot make a small request wait for them: a fresh client's
/// 4 KiB read is served from the small pool at once. Clients that pin small
/// requests compete with other small requests only, and give their budget
/// back after `stall_timeout` as before.
pub(super) struct GlobalBudget {
    pub(super) small: Pool,
    pub(super) large: Pool,
    /// Bytes held in both pools, and the most ever held (statistics only:
    /// atomics, so a request takes no lock beyond its pool's).
    pub(super) held: AtomicUsize,
    pub(super) peak: AtomicUsize,
}

/// One pool of budget with its ticket queue.
pub(super) struct Pool {
    pub(super) limit: usize,
    pub(super) state: Mutex<PoolState>,
    pub(super) freed: Condvar,
}

#[derive(Default)]
pub(super) struct PoolState {
    pub(super) held: usize,
    pub(super) next_ticket: u64,
    pub(super) serving: u64,
    /// Readers waiting for budget now.
    pub(super) waiting: usize,
}

impl Pool {
    pub(super) fn new(limit: usize) -> Pool {
        Pool {
            limit,
            state: Mutex::new(PoolState::default()),
            freed: Condvar::new(),
        }
    }

    pub(super) fn acquire(&self, n: usize) {
        let mut s = lock(&self.state);
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting += 1;
        while s.serving != ticket || s.held + n > self.limit {
            s = self.freed.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        s.waiting -= 1;
        s.held += n;
        s.serving += 1;
        let others = s.waiting > 0;
        drop(s);
        // The next ticket may fit too. (A notification is a system call:
        // only when someone waits.)
        if others {
            self.freed.notify_all();
        }
    }

    /// Takes `n` bytes if nobody waits and they are free now.
    pub(super) fn try_acquire(&self, n: usize) -> bool {
        let mut s = lock(&self.state);
        if s.serving != s.next_ticket || s.held + n > self.limit {
            return false;
        }
        s.held += n;
        true
    }

    pub(super) fn release(&self, n: usize) {
        let mut s = lock(&self.state);
        // Giving back more than is held is a bug of the caller (one such
        // wrapped the count and made every later request wait forever):
        // caught in debug builds, logged and clamped in release ones.
        debug_assert!(s.held >= n, "releasing {n} bytes of {} held", s.held);
        if s.held < n {
            log::error!(
                "NBD budget: {n} bytes given back but {} held (a bug); counted as 0",
                s.held
            );
        }
        s.held = s.held.saturating_sub(n);
        let waiting = s.waiting > 0;
        drop(s);
        if waiting {
            self.freed.notify_all();
        }
    }
}

impl GlobalBudget {
    /// A budget of `limit` bytes; `max_payload` is the largest request.
    pub(super) fn new(limit: usize, max_payload: usize) -> GlobalBudget {
        let small = (limit / 8).min(limit.saturating_sub(max_payload));
        GlobalBudget {
            small: Pool::new(small),
            large: Pool::new(limit - small),
            held: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// The pool a request of `n` bytes draws from, and the bytes it takes
    /// (at most the pool's size: a request's payload is at most
    /// `max_payload`, which the large pool always holds).
    pub(super) fn pool_of(&self, n: usize) -> (&Pool, usize) {
        if n <= SMALL_REQUEST_BYTES && self.small.limit >= n {
            (&self.small, n)
        } else {
            (&self.large, n.min(self.large.limit))
        }
    }

    /// Waits for `n` bytes.
    pub(super) fn acquire(&self, n: usize) {
        if n == 0 {
            return;
        }
        let (pool, n) = self.pool_of(n);
        pool.acquire(n);
        let held = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(held, Ordering::Relaxed);
    }

    /// Takes `n` bytes if that needs no wait.
    pub(super) fn try_acquire(&self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let (pool, n) = self.pool_of(n);
        if !pool.try_acquire(n) {
            return false;
        }
        let held = self.held.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(held, Ordering::Relaxed);
        true
    }

    pub(super) fn release(&self, n: usize) {
        if n == 0 {
            return;
        }
        let (pool, n) = self.pool_of(n);
        self.held.fetch_sub(n, Ordering::Relaxed);
        pool.release(n);
    }

    /// Whether some reader is waiting for budget.
    pub(super) fn contended(&self) -> bool {
        lock(&self.small.state).waiting > 0 || lock(&self.large.state).waiting > 0
    }

    pub(super) fn held_and_peak(&self) -> (usize, usize) {
        (
            self.held.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
}

/// A byte budget shared by a connection's reader and workers.
pub(super) struct Budget {
    /// Bytes available, and readers waiting for more.
    pub(super) available: Mutex<(usize, usize)>,
    pub(super) freed: Condvar,
}

impl Budget {
    pub(super) fn acquire(&self, n: usize) {
        let mut a = lock(&self.available);
        while a.0 < n {
            a.1 += 1;
            a = self.freed.wait(a).unwrap_or_else(|e| e.into_inner());
            a.1 -= 1;
        }
        a.0 -= n;
    }

    /// Takes `n` bytes if they are available now.
    pub(super) fn try_acquire(&self, n: usize) -> bool {
        let mut a = lock(&self.available);
        if a.0 < n {
            return false;
        }
        a.0 -= n;
        true
    }

    pub(super) fn release(&self, n: usize) {
        let mut a = lock(&self.available);
        a.0 += n;
        let waiting = a.1 > 0;
        drop(a);
        // A notification is a system call: only when someone waits.
        if waiting {
            self.freed.notify_all();
        }
    }
}
