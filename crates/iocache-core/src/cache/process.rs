//! What a controller sets apart for the requests of one process (ReCA
//! characterizing each process on its own, TPDS'18 §6.4): its category's
//! write policy, its line size as the extent a read miss fills, and its
//! priorities for the lines it touches. A cache has one layout and one
//! replacement order, so the line size is honoured through fills and the
//! eviction rule stays the cache's; see [`ProcessSettings`].

use super::*;

/// What a controller sets for the requests of one process.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessSettings {
    /// Replaces the cache-wide write policy for the process's requests
    /// ([`mode::resolve`]).
    pub write_policy: WritePolicy,
    /// The line size the process's category wants (`None`: the cache's).
    /// The cache keeps its own lines; what changes is what a read of the
    /// process fills:
    /// - larger than the cache's line: a read fills its own lines whole
    ///   (as [`Fill::Line`]); when it missed a sector and every line it
    ///   missed was admitted, the rest of the aligned extents of this size
    ///   that it touches is left for the driver to fetch as a readahead
    ///   fill ([`Cache::take_extent_fill`], [`AccessHints::prefetch`]:
    ///   admitted as the request's lines were, counted in the `prefetch_*`
    ///   counters). The extent is admitted or not as a whole, as one large
    ///   line would be; its lines are still evicted one by one;
    /// - smaller: its reads fill only the sectors they ask for, whatever
    ///   [`Fill`] says;
    /// - equal: as the cache is configured.
    pub line_size: Option<LineSize>,
    /// The replacement policy's parameters for the process's accesses
    /// (`ReplacementPolicy::set_process_params`): taken only by a policy of
    /// the same name as the cache's that supports it (`reca`: its
    /// priority weights), ignored otherwise.
    pub policy: Option<PolicySpec>,
}

impl ProcessSettings {
    /// Settings that set apart only the write policy.
    pub fn write_policy(policy: WritePolicy) -> ProcessSettings {
        ProcessSettings {
            write_policy: policy,
            line_size: None,
            policy: None,
        }
    }
}

/// What a request's process changes in its decision (see
/// [`Cache::process_facts`]).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ProcessFacts {
    pub(super) write_policy: Option<WritePolicy>,
    /// The process's line size, when it differs from the cache's.
    pub(super) line_size: Option<LineSize>,
}

impl Cache {
    /// Sets (or, with `None`, withdraws) what a controller sets apart for
    /// the requests of `process` ([`ProcessSettings`]). Process 0 (none
    /// recorded) is never set apart. A policy spec the cache's policy
    /// refuses is an error, and nothing changes.
    pub fn set_process_settings(
        &mut self,
        process: u32,
        settings: Option<ProcessSettings>,
    ) -> Result<(), CoreError> {
        let settings = settings.filter(|_| process != 0);
        let spec = settings.as_ref().and_then(|s| s.policy.as_ref());
        let params = spec.filter(|spec| spec.name() == self.config.policy.name());
        self.policy
            .set_process_params(process, params.map(|s| s.params()))?;
        match settings {
            Some(settings) => {
                self.processes.insert(process, settings);
            }
            None => {
                self.processes.remove(&process);
            }
        }
        if self.processes.is_empty() {
            self.extent_fill = None;
        }
        Ok(())
    }

    /// Sets (or withdraws) a controller's write policy for the requests of
    /// `process` alone, nothing else ([`ProcessSettings::write_policy`]).
    pub fn set_process_policy(&mut self, process: u32, policy: Option<WritePolicy>) {
        self.set_process_settings(process, policy.map(ProcessSettings::write_policy))
            .expect("settings without a policy spec are always taken");
    }

    /// The settings of every process set apart, by process.
    pub fn process_settings(&self) -> Vec<(u32, ProcessSettings)> {
        let mut all: Vec<_> = (self.processes.iter()).map(|(&p, s)| (p, s.clone())).collect();
        all.sort_unstable_by_key(|(process, _)| *process);
        all
    }

    /// The write policies set per process, by process.
    pub fn process_policies(&self) -> Vec<(u32, WritePolicy)> {
        (self.process_settings().into_iter())
            .map(|(p, s)| (p, s.write_policy))
            .collect()
    }

    /// The read the driver should fetch as a readahead fill
    /// ([`AccessHints::prefetch`]) after the last request: the aligned
    /// extents of its process's larger line size, when it missed (see
    /// [`ProcessSettings::line_size`]). Taken once.
    #[inline]
    pub fn take_extent_fill(&mut self) -> Option<Request> {
        match self.extent_fill {
            None => None,
            Some(_) => self.extent_fill.take(),
        }
    }

    /// What `request`'s process changes (called only when some process is
    /// set apart, so a cache without any pays one branch per request).
    #[cold]
    pub(super) fn process_facts(&mut self, request: &Request) -> ProcessFacts {
        self.extent_fill = None;
        let Some(settings) = self.processes.get(&request.process) else {
            return ProcessFacts::default();
        };
        ProcessFacts {
            write_policy: Some(settings.write_policy),
            line_size: settings.line_size.filter(|&l| l != self.line),
        }
    }

    /// After a read of a process whose line size is larger than the
    /// cache's: the extents to fill, if the read missed, its policy fills
    /// on read, and every line it missed was admitted (`all_admitted`: the
    /// extent is one large line, admitted or not as a whole).
    pub(super) fn plan_extent_fill(
        &mut self,
        request: &Request,
        extent: LineSize,
        summary: &AccessSummary,
        all_admitted: bool,
    ) {
        if summary.misses + summary.partial_hits == 0
            || !all_admitted
            || !self.request_policy.allocates_on_read()
            || self.request_policy == WritePolicy::PassThrough
        {
            return;
        }
        let mask = extent.bytes() - 1;
        let start = request.offset_bytes & !mask;
        let Some(end) =
            (request.offset_bytes + request.length_bytes).checked_next_multiple_of(extent.bytes())
        else {
            return;
        };
        self.extent_fill = Some(Request {
            offset_bytes: start,
            length_bytes: end - start,
            kind: IoKind::Read,
            ..*request
        });
    }

    /// The write policy a readahead fill of `request` is decided under:
    /// its process's when set apart, else the cache-wide one.
    pub(super) fn fill_policy(&self, request: &Request) -> WritePolicy {
        let facts = RequestFacts {
            process_policy: match self.processes.is_empty() {
                true => None,
                false => self.processes.get(&request.process).map(|s| s.write_policy),
            },
            ..RequestFacts::default()
        };
        mode::resolve(&self.mode, Some(&facts), None).policy
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{CacheConfig, Promotion};

    fn cache(line: u64, fill: Fill) -> Cache {
        let mut config = CacheConfig::new(64, LineSize::new(line).unwrap(), PolicySpec::lru());
        config.fill = fill;
        Cache::new(config).unwrap()
    }

    fn settings(line: u64) -> ProcessSettings {
        ProcessSettings {
            line_size: Some(LineSize::new(line).unwrap()),
            ..ProcessSettings::write_policy(WritePolicy::WriteBack)
        }
    }

    /// The sectors of `request`'s lines the cache holds.
    fn valid_sectors(c: &Cache, request: &Request) -> u32 {
        split_request(request, c.line_size())
            .filter_map(|p| c.line_state(p.key))
            .map(|s| s.valid_sectors)
            .sum()
    }

    #[test]
    fn a_larger_line_fills_the_extent_of_its_process_alone() {
        let mut c = cache(4096, Fill::Request);
        c.set_process_settings(1, Some(settings(32 << 10))).unwrap();
        let mut ops = OpList::new();
        // Process 2 (not set apart): the request's sectors only, no extent.
        c.access(&Request::read(0, 1 << 20, 512, 0).from_process(2), &mut ops)
            .unwrap();
        assert_eq!(c.take_extent_fill(), None);
        assert_eq!(valid_sectors(&c, &Request::read(0, 1 << 20, 4096, 0)), 1);
        // Process 1: its line whole, and its 32 KiB extent left to fetch.
        let r = Request::read(0, 40 << 10, 512, 1).from_process(1);
        let summary = c.access(&r, &mut ops).unwrap();
        assert!(summary.line_origin);
        assert_eq!(valid_sectors(&c, &Request::read(0, 40 << 10, 4096, 0)), 8);
        let fill = c.take_extent_fill().expect("an extent to fill");
        assert_eq!(
            (fill.offset_bytes, fill.length_bytes, fill.kind, fill.process),
            (32 << 10, 32 << 10, IoKind::Read, 1)
        );
        assert_eq!(c.take_extent_fill(), None, "taken once");
        let prefetch = AccessHints {
            prefetch: true,
            ..AccessHints::default()
        };
        c.access_with(&fill, prefetch, &mut ops).unwrap();
        assert_eq!(c.stats().prefetched_lines, 7);
        // The rest of the extent hits: no further fill.
        let again = Request::read(0, 32 << 10, 32 << 10, 2).from_process(1);
        assert_eq!(c.access(&again, &mut ops).unwrap().full_hits, 8);
        assert_eq!(c.take_extent_fill(), None);
        // A write plans no fill.
        c.access(&Request::write(0, 1 << 30, 4096, 3).from_process(1), &mut ops)
            .unwrap();
        assert_eq!(c.take_extent_fill(), None);
        c.check_invariants();
    }

    #[test]
    fn an_extent_is_filled_only_when_its_missed_lines_were_admitted() {
        let mut c = cache(4096, Fill::Request);
        c.set_promotion(Promotion::NHit {
            threshold: 2,
            trigger_percent: 0,
        });
        c.set_process_settings(1, Some(settings(32 << 10))).unwrap();
        let mut ops = OpList::new();
        let r = Request::read(0, 0, 4096, 0).from_process(1);
        // First miss: not admitted, so neither is the rest of its extent.
        c.access(&r, &mut ops).unwrap();
        assert_eq!(c.take_extent_fill(), None);
        // Second: admitted, and the extent with it.
        c.access(&r, &mut ops).unwrap();
        assert_eq!(c.take_extent_fill().map(|f| f.length_bytes), Some(32 << 10));
    }

    #[test]
    fn a_smaller_line_fills_only_what_its_process_asks() {
        let mut c = cache(8192, Fill::Line);
        c.set_process_settings(1, Some(settings(4096))).unwrap();
        let mut ops = OpList::new();
        let mine = Request::read(0, 0, 512, 0).from_process(1);
        assert!(!c.access(&mine, &mut ops).unwrap().line_origin);
        assert_eq!(valid_sectors(&c, &mine), 1);
        assert_eq!(c.take_extent_fill(), None);
        // Another process's read fills its line whole.
        let other = Request::read(0, 1 << 20, 512, 1).from_process(2);
        assert!(c.access(&other, &mut ops).unwrap().line_origin);
        assert_eq!(valid_sectors(&c, &other), 16);
        // A process with the cache's line size: as configured.
        c.set_process_settings(3, Some(settings(8192))).unwrap();
        let same = Request::read(0, 2 << 20, 512, 2).from_process(3);
        assert!(c.access(&same, &mut ops).unwrap().line_origin);
        c.check_invariants();
    }

    #[test]
    fn a_forgotten_process_gets_the_cache_wide_fill_again() {
        let mut c = cache(4096, Fill::Request);
        c.set_process_settings(1, Some(settings(64 << 10))).unwrap();
        let mut ops = OpList::new();
        c.access(&Request::read(0, 0, 512, 0).from_process(1), &mut ops)
            .unwrap();
        assert!(c.extent_fill.is_some());
        // Withdrawn before the driver took it: nothing is left to fetch.
        c.set_process_settings(1, None).unwrap();
        assert_eq!(c.take_extent_fill(), None);
        assert!(c.process_settings().is_empty());
        let r = Request::read(0, 1 << 20, 512, 1).from_process(1);
        assert!(!c.access(&r, &mut ops).unwrap().line_origin);
        assert_eq!(c.take_extent_fill(), None);
        // Process 0 is never set apart.
        c.set_process_settings(0, Some(settings(64 << 10))).unwrap();
        assert!(c.process_settings().is_empty());
    }
}
