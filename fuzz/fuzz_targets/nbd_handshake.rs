//! A whole session from the first byte: the input is everything a client
//! sends (client flags, options, then requests). See
//! `iocache_nbd::fuzzing` and docs/fuzzing.md.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = iocache_nbd::fuzzing::session(data) {
        panic!("{v}");
    }
});
