//! Helpers the simulator's integration tests share: an in-memory trace
//! reader and the run specs of one line size and write policy.

#![allow(dead_code)]

use iocache_core::{LineSize, PolicySpec, WritePolicy};
use iocache_sim::{combinations, CacheSettings, CacheSize, RunSpec};
use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};

/// A reader of the trace `text`, held in memory and named "memory".
pub fn memory_reader(text: impl AsRef<[u8]>, format: TraceFormat) -> TraceReader {
    TraceReader::from_bytes("memory", text.as_ref(), Some(format), ReaderOptions::default()).unwrap()
}

/// One run of each of `policies` at each of `sizes`, with lines of
/// `line_bytes` under `write_policy` (every other setting the default).
pub fn specs(
    policies: &[PolicySpec],
    sizes: &[CacheSize],
    line_bytes: u64,
    write_policy: WritePolicy,
) -> Vec<RunSpec> {
    combinations(
        policies,
        sizes,
        &[LineSize::new(line_bytes).unwrap()],
        &CacheSettings {
            write_policy,
            ..CacheSettings::default()
        },
    )
    .unwrap()
}

/// One step of the xorshift generator the randomized tests draw from:
/// advances `state` and returns it.
pub fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
