#!/usr/bin/env bash
# Runs the libFuzzer targets in fuzz/ (CI does not call this; CI runs the
# same bodies under proptest in crates/iocache-nbd/tests/fuzz_session.rs).
#
#   scripts/fuzz.sh [TARGET] [SECONDS]
#
# TARGET is nbd_request, nbd_handshake, metadata_loader or all (the default); SECONDS is the
# time per target (default 60). The corpus lives in fuzz/corpus/TARGET (seeded
# from iocache_nbd::fuzzing::seeds on every run) and crashes land in
# fuzz/artifacts/TARGET; both are ignored by git. See docs/fuzzing.md.
#
# Environment:
#   FUZZ_SANITIZER  none (default) or address
#   FUZZ_ARGS       extra libFuzzer arguments, e.g. "-jobs=2 -workers=2"
#   CARGO_TARGET_DIR  build directory base (the fuzz build uses $CARGO_TARGET_DIR/fuzz)
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a C++ compiler (libfuzzer-sys
# builds libFuzzer). Without a sanitizer every flag cargo-fuzz passes to rustc
# is stable; a sanitizer is -Zsanitizer=..., so on a stable toolchain the
# script then sets RUSTC_BOOTSTRAP=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ALL_TARGETS=(nbd_request nbd_handshake metadata_loader)
target=${1:-all}
seconds=${2:-60}
sanitizer=${FUZZ_SANITIZER:-none}
target_dir=${CARGO_TARGET_DIR:-$PWD/target}/fuzz

if [[ "$target" == all ]]; then
    targets=("${ALL_TARGETS[@]}")
elif [[ " ${ALL_TARGETS[*]} " == *" $target "* ]]; then
    targets=("$target")
else
    echo "unknown target '$target' (one of: ${ALL_TARGETS[*]}, all)" >&2
    exit 2
fi
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || ((seconds == 0)); then
    echo "SECONDS must be a positive integer, not '$seconds'" >&2
    exit 2
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is not installed: cargo install cargo-fuzz" >&2
    exit 1
fi
if [[ "$sanitizer" != none ]] && ! rustc --version | grep -q nightly; then
    export RUSTC_BOOTSTRAP=1
fi

echo "==> seeding fuzz/corpus"
cargo run --quiet --release -p iocache-nbd --example fuzz_seeds -- fuzz/corpus
cargo run --quiet --release -p iocache-format --example format_seeds -- fuzz/corpus

for t in "${targets[@]}"; do
    echo "==> cargo fuzz run $t -s $sanitizer (${seconds}s)"
    mkdir -p "fuzz/artifacts/$t"
    # -timeout: one input taking more than 10 s is a hang (a session takes
    # milliseconds). ${FUZZ_ARGS} is split on purpose.
    # shellcheck disable=SC2086
    cargo fuzz run "$t" -s "$sanitizer" --target-dir "$target_dir" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" ${FUZZ_ARGS:-}
done
