//! How a request is treated (write-back, write-through,
//! pass-through, ...) depends on several things at once: the policy the
//! operator configured, a policy an adaptive controller (ReCA, LBICA) sets
//! for a while, a cache device that failed (everything passes through), a
//! sequential stream past the cutoff, a write that would supersede dirty
//! sectors only the cache holds, and the cap on dirty lines. Each once lived
//! in its own place, and nothing could say which one was in force. Here one
//! function, [`resolve`], decides, in one order, and says why; the cache
//! asks it for every request and every written line, and statistics report
//! its answer (the model: Open CAS's `ocf_resolve_effective_cache_mode`).
//!
//! The order, first to last (a later rule sees what the earlier ones chose):
//!
//! 1. the configured policy, replaced by the controller's while it sets one,
//!    and for a request of a process the controller set a policy for (ReCA
//!    characterizing each process on its own), by that process's;
//! 2. pass-through while the cache device is failed;
//! 3. pass-through for a request of a sequential stream past the cutoff,
//!    and for a request a load balancer sends to the backend (LBICA's tail
//!    bypass, SIB: `balance/`; the cache asks for it only when none of the
//!    request's sectors is dirty, so the backend holds its latest data);
//! 4. per written line: write-back when the write would supersede dirty
//!    sectors whose only copy is the cache's and the policy would send it to
//!    the backend (were the backend write to fail, the older data would be
//!    gone from both), unless dirty lines are evicted inline;
//! 5. per written line: write-through when the policy keeps dirty data, the
//!    cap on dirty lines is reached and the line is not dirty already.

use crate::config::WritePolicy;

/// Why the effective policy is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModeCause {
    /// The configured policy.
    Configured,
    /// A policy set by an adaptive controller (or the operator's
    /// temporary override) in place of the configured one.
    Controller,
    /// The cache device failed: nothing new is cached until it answers.
    CacheDeviceFailed,
    /// The request belongs to a sequential stream past the cutoff.
    SequentialCutoff,
    /// A load balancer sent the request to the backend (its data is clean).
    LoadBalance,
    /// The write supersedes dirty sectors only the cache holds.
    DirtySupersede,
    /// The cap on dirty lines is reached.
    DirtyCap,
}

impl ModeCause {
    /// A short name for statistics and logs.
    pub fn name(self) -> &'static str {
        match self {
            ModeCause::Configured => "configured or set",
            ModeCause::Controller => "controller",
            ModeCause::CacheDeviceFailed => "cache device failed",
            ModeCause::SequentialCutoff => "sequential cutoff",
            ModeCause::LoadBalance => "load balance",
            ModeCause::DirtySupersede => "dirty supersede",
            ModeCause::DirtyCap => "dirty cap",
        }
    }
}

display_by_name!(ModeCause, name);

/// The policy in force and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EffectiveMode {
    pub policy: WritePolicy,
    pub cause: ModeCause,
}

/// The cache-wide inputs of the decision: what the operator configured,
/// what a controller set, and whether the cache device is failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModeSettings {
    pub configured: WritePolicy,
    pub controller: Option<WritePolicy>,
    pub cache_device_failed: bool,
}

impl ModeSettings {
    pub fn new(configured: WritePolicy) -> ModeSettings {
        ModeSettings {
            configured,
            controller: None,
            cache_device_failed: false,
        }
    }
}

/// What the decision needs to know about one request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestFacts {
    /// A controller's write policy for the process that issued the request.
    pub process_policy: Option<WritePolicy>,
    /// The sequential-cutoff detector sent the request around the cache.
    pub sequential_bypass: bool,
    /// A load balancer sends the request to the backend, and none of its
    /// sectors is dirty in the cache.
    pub balance_bypass: bool,
}

/// What the decision needs to know about one line a write touches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineFacts {
    /// The written sectors include dirty ones (only the cache holds them).
    pub supersedes_dirty: bool,
    /// The line is on the dirty list already (it adds no dirty line).
    pub already_dirty: bool,
    /// Dirty lines in the cache now.
    pub dirty_lines: u64,
    /// The cap on dirty lines, if any.
    pub dirty_cap: Option<u64>,
    /// Dirty lines are evicted inline (the supersede rule does not apply).
    pub inline_dirty_eviction: bool,
}

/// The effective policy: the cache-wide one when `request` and `line` are
/// `None`, a request's when `line` is `None`, a written line's with both.
/// The one place that decides it (see the module doc for the order).
pub fn resolve(
    settings: &ModeSettings,
    request: Option<&RequestFacts>,
    line: Option<&LineFacts>,
) -> EffectiveMode {
    let mut mode = match settings.controller {
        Some(policy) => EffectiveMode {
            policy,
            cause: ModeCause::Controller,
        },
        None => EffectiveMode {
            policy: settings.configured,
            cause: ModeCause::Configured,
        },
    };
    if let Some(policy) = request.and_then(|r| r.process_policy) {
        mode = EffectiveMode {
            policy,
            cause: ModeCause::Controller,
        };
    }
    if settings.cache_device_failed {
        mode = EffectiveMode {
            policy: WritePolicy::PassThrough,
            cause: ModeCause::CacheDeviceFailed,
        };
    }
    if request.is_some_and(|r| r.sequential_bypass) {
        mode = EffectiveMode {
            policy: WritePolicy::PassThrough,
            cause: ModeCause::SequentialCutoff,
        };
    }
    if request.is_some_and(|r| r.balance_bypass) && mode.policy != WritePolicy::PassThrough {
        mode = EffectiveMode {
            policy: WritePolicy::PassThrough,
            cause: ModeCause::LoadBalance,
        };
    }
    if let Some(line) = line {
        if !line.inline_dirty_eviction && !mode.policy.keeps_dirty() && line.supersedes_dirty {
            mode = EffectiveMode {
                policy: WritePolicy::WriteBack,
                cause: ModeCause::DirtySupersede,
            };
        }
        if let Some(cap) = line.dirty_cap {
            if mode.policy.keeps_dirty() && line.dirty_lines >= cap && !line.already_dirty {
                mode = EffectiveMode {
                    policy: WritePolicy::WriteThrough,
                    cause: ModeCause::DirtyCap,
                };
            }
        }
    }
    mode
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_of_the_rules() {
        for configured in WritePolicy::ALL {
            let mut s = ModeSettings::new(configured);
            assert_eq!(
                resolve(&s, None, None),
                EffectiveMode {
                    policy: configured,
                    cause: ModeCause::Configured
                }
            );
            s.controller = Some(WritePolicy::WriteAround);
            assert_eq!(resolve(&s, None, None).cause, ModeCause::Controller);
            assert_eq!(resolve(&s, None, None).policy, WritePolicy::WriteAround);
            // A failed device wins over the controller.
            s.cache_device_failed = true;
            assert_eq!(resolve(&s, None, None).policy, WritePolicy::PassThrough);
            assert_eq!(resolve(&s, None, None).cause, ModeCause::CacheDeviceFailed);
            // Superseding dirty data is kept in the cache whatever came before.
            let line = LineFacts {
                supersedes_dirty: true,
                ..LineFacts::default()
            };
            let seq = RequestFacts {
                sequential_bypass: true,
                ..RequestFacts::default()
            };
            let m = resolve(&s, Some(&seq), Some(&line));
            assert_eq!(
                (m.policy, m.cause),
                (WritePolicy::WriteBack, ModeCause::DirtySupersede)
            );
            // Unless lines are evicted inline.
            let inline = LineFacts {
                inline_dirty_eviction: true,
                ..line
            };
            assert_eq!(
                resolve(&s, Some(&seq), Some(&inline)).cause,
                ModeCause::SequentialCutoff
            );
        }
    }

    #[test]
    fn a_process_policy_replaces_the_cache_wide_one_for_its_requests_only() {
        let mut s = ModeSettings::new(WritePolicy::WriteBack);
        s.controller = Some(WritePolicy::WriteThrough);
        let mine = RequestFacts {
            process_policy: Some(WritePolicy::WriteAround),
            ..RequestFacts::default()
        };
        let m = resolve(&s, Some(&mine), None);
        assert_eq!(
            (m.policy, m.cause),
            (WritePolicy::WriteAround, ModeCause::Controller)
        );
        // Other requests keep the cache-wide controller's.
        let other = resolve(&s, Some(&RequestFacts::default()), None);
        assert_eq!(other.policy, WritePolicy::WriteThrough);
        // A failed device and superseding dirty data still win.
        s.cache_device_failed = true;
        assert_eq!(resolve(&s, Some(&mine), None).cause, ModeCause::CacheDeviceFailed);
        s.cache_device_failed = false;
        let line = LineFacts {
            supersedes_dirty: true,
            ..LineFacts::default()
        };
        assert_eq!(
            resolve(&s, Some(&mine), Some(&line)).cause,
            ModeCause::DirtySupersede
        );
    }

    #[test]
    fn the_dirty_cap_writes_through_only_new_dirty_lines() {
        let s = ModeSettings::new(WritePolicy::WriteBack);
        let at_cap = LineFacts {
            dirty_lines: 4,
            dirty_cap: Some(4),
            ..LineFacts::default()
        };
        let m = resolve(&s, None, Some(&at_cap));
        assert_eq!(
            (m.policy, m.cause),
            (WritePolicy::WriteThrough, ModeCause::DirtyCap)
        );
        let dirty_already = LineFacts {
            already_dirty: true,
            ..at_cap
        };
        assert_eq!(
            resolve(&s, None, Some(&dirty_already)).policy,
            WritePolicy::WriteBack
        );
        let below = LineFacts {
            dirty_lines: 3,
            ..at_cap
        };
        assert_eq!(resolve(&s, None, Some(&below)).cause, ModeCause::Configured);
        // The cap applies to a supersede turned write-back too.
        let ws = ModeSettings::new(WritePolicy::WriteThrough);
        let superseding = LineFacts {
            supersedes_dirty: true,
            ..at_cap
        };
        assert_eq!(resolve(&ws, None, Some(&superseding)).cause, ModeCause::DirtyCap);
    }

    #[test]
    fn a_balance_bypass_passes_through_but_never_drops_dirty_data() {
        for configured in WritePolicy::ALL {
            let mut s = ModeSettings::new(configured);
            s.controller = Some(WritePolicy::WriteOnly);
            let bypass = RequestFacts {
                balance_bypass: true,
                ..RequestFacts::default()
            };
            let m = resolve(&s, Some(&bypass), None);
            assert_eq!(
                (m.policy, m.cause),
                (WritePolicy::PassThrough, ModeCause::LoadBalance)
            );
            // A written line with dirty sectors stays in the cache.
            let line = LineFacts {
                supersedes_dirty: true,
                ..LineFacts::default()
            };
            assert_eq!(
                resolve(&s, Some(&bypass), Some(&line)).cause,
                ModeCause::DirtySupersede
            );
            // An earlier reason for passing through is kept.
            let both = RequestFacts {
                sequential_bypass: true,
                balance_bypass: true,
                ..RequestFacts::default()
            };
            assert_eq!(resolve(&s, Some(&both), None).cause, ModeCause::SequentialCutoff);
        }
    }
}
