//! The request parser and the transmission phase. The first input byte
//! picks a valid handshake (reply style, export, GO or EXPORT_NAME); the
//! rest is the request stream a client sends. Every 28-byte chunk of the
//! input also goes through `RequestHeader::parse` alone, compared with the
//! model. See `iocache_nbd::fuzzing` and docs/fuzzing.md.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(v) = iocache_nbd::fuzzing::request_headers(data) {
        panic!("{v}");
    }
    if let Err(v) = iocache_nbd::fuzzing::transmission(data) {
        panic!("{v}");
    }
});
