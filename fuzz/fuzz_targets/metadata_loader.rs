//! The cache device's metadata loader: the input is a device image (the two
//! superblock copies, then the record regions if a superblock is valid) and,
//! separately, a record region pair for a line size picked by the first
//! byte. The decoders must never panic, and anything they accept as valid
//! must re-encode to the bytes it came from. See iocache_format::fuzzing and
//! docs/fuzzing.md.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = iocache_format::fuzzing::load_superblock_and_metadata(data);
    let _ = iocache_format::fuzzing::decode_records(data);
});
