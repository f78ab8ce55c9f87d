//! LBICA chooses a write policy from what waits in the
//! cache device's queue (DATE'19 §III-B). Every request there is one of four
//! classes: an application read hit (R), an application write (W), the
//! promotion of a missed read (P) or an eviction or write-back (E). The mix
//! of classes says what kind of workload makes the cache the bottleneck;
//! [`characterize`] turns it into one of the paper's groups.
//!
//! How a mix becomes a group (the paper names the groups by the classes that
//! "mainly" make them up, without numbers; the thresholds are ours and
//! configurable in [`GroupThresholds`]):
//!
//! 1. P alone at least `sequential_read_share` (default 75 %): a sequential
//!    read (Group 4: every read misses and is promoted). The paper's TPC-C
//!    example has P at 51 % and is a random read, so this must be well
//!    above one half.
//! 2. Otherwise the largest of the pairs R+P, R+W and W+E, if it reaches
//!    `min_pair_share` (default 60 %): R+P is a random read (Group 1), R+W a
//!    mixed read-write workload (Group 2), W+E a write-intensive one
//!    (Group 3), random when W ≥ E and sequential otherwise. On a tie the
//!    order is R+P, W+E, R+W (a queue of writes alone, R = E = 0, ties R+W
//!    with W+E and is write-intensive, not mixed). R+P and R+W count only when P (resp. W)
//!    makes at least `min_second_share` (default 20 %) of the queue: the
//!    policy chosen for them takes exactly that class off the cache (WO the
//!    promotions, RO the writes), and a queue of 95 % read hits is neither
//!    a random read with misses nor a mixed workload (every example of the
//!    paper has the second class at 51 % or more).
//! 3. Anything else (R+E or W+P majorities, which the paper says do not
//!    occur, a queue of read hits, or no clear majority) is unclassified.

/// The class of one request in the cache device's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestClass {
    /// An application read served by the cache (a hit).
    ReadHit = 0,
    /// An application write stored in the cache.
    Write = 1,
    /// A missed line written into the cache (promotion, fill).
    Promotion = 2,
    /// Dirty data read from the cache to be written back (eviction, flush).
    Eviction = 3,
}

impl RequestClass {
    pub const ALL: [RequestClass; 4] = [
        RequestClass::ReadHit,
        RequestClass::Write,
        RequestClass::Promotion,
        RequestClass::Eviction,
    ];

    /// The paper's letter: R, W, P or E.
    pub fn letter(self) -> char {
        ['R', 'W', 'P', 'E'][self as usize]
    }
}

/// Requests of each class in the queue (counts, or means over an interval).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueMix {
    /// Indexed by `RequestClass as usize`.
    pub by_class: [f64; 4],
}

impl QueueMix {
    pub fn new(read_hits: f64, writes: f64, promotions: f64, evictions: f64) -> QueueMix {
        QueueMix {
            by_class: [read_hits, writes, promotions, evictions],
        }
    }

    pub fn total(&self) -> f64 {
        self.by_class.iter().sum()
    }

    /// Each class's share of the total (all zero for an empty queue).
    pub fn shares(&self) -> MixShares {
        let total = self.total();
        let share = |c: RequestClass| {
            if total > 0.0 {
                self.by_class[c as usize] / total
            } else {
                0.0
            }
        };
        MixShares {
            read_hits: share(RequestClass::ReadHit),
            writes: share(RequestClass::Write),
            promotions: share(RequestClass::Promotion),
            evictions: share(RequestClass::Eviction),
        }
    }
}

/// The shares of R, W, P and E, each in [0, 1], summing to 1 (or all 0).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MixShares {
    pub read_hits: f64,
    pub writes: f64,
    pub promotions: f64,
    pub evictions: f64,
}

impl MixShares {
    /// From percentages, as the paper gives them.
    pub fn percent(r: f64, w: f64, p: f64, e: f64) -> MixShares {
        QueueMix::new(r, w, p, e).shares()
    }
}

/// The paper's workload groups (§III-B), with Group 3 split as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WorkloadGroup {
    /// Group 1: mainly R and P.
    RandomRead,
    /// Group 2: mainly R and W.
    MixedReadWrite,
    /// Group 3 with at least as many W as E.
    RandomWrite,
    /// Group 3 with more E than W.
    SequentialWrite,
    /// Group 4: mainly P.
    SequentialRead,
    /// None of the above.
    Unclassified,
}

impl WorkloadGroup {
    pub fn name(self) -> &'static str {
        match self {
            WorkloadGroup::RandomRead => "random-read",
            WorkloadGroup::MixedReadWrite => "mixed",
            WorkloadGroup::RandomWrite => "random-write",
            WorkloadGroup::SequentialWrite => "seq-write",
            WorkloadGroup::SequentialRead => "seq-read",
            WorkloadGroup::Unclassified => "unclassified",
        }
    }
}

display_by_name!(WorkloadGroup, name);

/// Where one group ends and the next begins (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupThresholds {
    /// P's share from which the queue is a sequential read.
    pub sequential_read_share: f64,
    /// The share the largest pair must reach to name the group.
    pub min_pair_share: f64,
    /// The share P must have for R+P, and W for R+W, to count.
    pub min_second_share: f64,
}

impl Default for GroupThresholds {
    fn default() -> Self {
        GroupThresholds {
            sequential_read_share: 0.75,
            min_pair_share: 0.6,
            min_second_share: 0.2,
        }
    }
}

/// The group of a queue with these shares (see the module doc).
pub fn characterize(shares: &MixShares, thresholds: &GroupThresholds) -> WorkloadGroup {
    let MixShares {
        read_hits: r,
        writes: w,
        promotions: p,
        evictions: e,
    } = *shares;
    if r + w + p + e <= 0.0 {
        return WorkloadGroup::Unclassified;
    }
    if p >= thresholds.sequential_read_share {
        return WorkloadGroup::SequentialRead;
    }
    let write_group = if w >= e {
        WorkloadGroup::RandomWrite
    } else {
        WorkloadGroup::SequentialWrite
    };
    let second = thresholds.min_second_share;
    let pairs = [
        (p >= second, r + p, WorkloadGroup::RandomRead),
        (true, w + e, write_group),
        (w >= second, r + w, WorkloadGroup::MixedReadWrite),
    ];
    let mut best: Option<(f64, WorkloadGroup)> = None;
    for &(eligible, share, group) in &pairs {
        if eligible && best.is_none_or(|(b, _)| share > b) {
            best = Some((share, group));
        }
    }
    match best {
        Some((share, group)) if share >= thresholds.min_pair_share => group,
        _ => WorkloadGroup::Unclassified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shares of R, W, P and E in percent.
    type Percent = (f64, f64, f64, f64);

    /// Each case's shares and the group they make.
    fn check_groups(cases: &[(Percent, WorkloadGroup)]) {
        for &((r, w, p, e), expected) in cases {
            let got = characterize(&MixShares::percent(r, w, p, e), &GroupThresholds::default());
            assert_eq!(got, expected, "R {r} W {w} P {p} E {e}");
        }
    }

    #[test]
    fn the_papers_examples() {
        use WorkloadGroup::*;
        check_groups(&[
            // §IV-C: TPC-C at interval 3, random read.
            ((44.0, 2.2, 51.0, 2.8), RandomRead),
            // Mail server at interval 23, mixed.
            ((13.9, 70.4, 3.9, 11.8), MixedReadWrite),
            // Web server at interval 1, mixed.
            ((17.9, 63.8, 7.9, 10.4), MixedReadWrite),
            // Mail server at interval 134: about 90 % W and E.
            ((5.0, 60.0, 5.0, 30.0), RandomWrite),
            ((5.0, 30.0, 5.0, 60.0), SequentialWrite),
        ]);
    }

    #[test]
    fn the_boundaries() {
        use WorkloadGroup::*;
        check_groups(&[
            ((10.0, 5.0, 80.0, 5.0), SequentialRead),
            ((25.0, 0.0, 75.0, 0.0), SequentialRead),
            ((26.0, 0.0, 74.0, 0.0), RandomRead),
            // R+E and W+P majorities, and no majority at all.
            ((50.0, 0.0, 0.0, 50.0), Unclassified),
            ((0.0, 50.0, 50.0, 0.0), Unclassified),
            ((0.0, 0.0, 0.0, 0.0), Unclassified),
            // Mostly read hits: too few P or W for WO or RO to relieve the cache.
            ((95.0, 4.5, 0.5, 0.0), Unclassified),
            ((70.0, 19.0, 11.0, 0.0), Unclassified),
            ((70.0, 9.0, 21.0, 0.0), RandomRead),
            ((70.0, 21.0, 9.0, 0.0), MixedReadWrite),
            // Writes alone: write-intensive, not mixed (R+W ties W+E).
            ((0.0, 100.0, 0.0, 0.0), RandomWrite),
            // A pair of exactly 60 % counts.
            ((30.0, 30.0, 20.0, 20.0), MixedReadWrite),
            ((29.0, 30.0, 21.0, 20.0), Unclassified),
        ]);
    }

    #[test]
    fn shares_sum_to_one() {
        let s = QueueMix::new(2.0, 1.0, 1.0, 0.0).shares();
        assert_eq!(
            (s.read_hits, s.writes, s.promotions, s.evictions),
            (0.5, 0.25, 0.25, 0.0)
        );
        assert_eq!(QueueMix::default().shares(), MixShares::default());
    }
}
