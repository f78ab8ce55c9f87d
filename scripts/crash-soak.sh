#!/usr/bin/env bash
# Crash soak: runs the SIGKILL crash harness of tests/crash.rs for many
# iterations per mode (not run by CI).
#
#   scripts/crash-soak.sh [ITERATIONS] [MODE...]
#
# ITERATIONS (default 300) is per mode. MODE is one of
#   wt      --write-policy wt
#   wt-cached  as wt, with the whole volume cached (--cache-size 40MiB)
#   all     --write-policy wb --persistence all
#   dirty   --write-policy wb --persistence dirty
#   none    --write-policy wb --persistence none --force
#   shm     as all, with the files in /dev/shm (the cache file mapped)
#   custom  the server arguments in IOCACHE_CRASH_ARGS
# Without a MODE: wt and wt-cached, plus all, dirty, none and shm when `iocache serve --help`
# lists --persistence. IOCACHE_CRASH_SEED fixes the seed. The whole output goes
# to a log file (CRASH_SOAK_LOG, default target/crash-soak.log); the terminal
# shows every 25th iteration, each mode's summary (iterations, kills, writes
# verified, failures) and any failure in full.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

iterations=${1:-300}
shift || true
if ! [[ "$iterations" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 [ITERATIONS] [wt|wt-cached|all|dirty|none|shm|custom ...]" >&2
    exit 2
fi

echo "==> building"
cargo build --release --quiet
cargo test --release --quiet --test crash --no-run

target_dir=${CARGO_TARGET_DIR:-target}
modes=("$@")
if ((${#modes[@]} == 0)); then
    modes=(wt wt-cached)
    if "$target_dir/release/iocache" serve --help | grep -q -- '--persistence'; then
        modes+=(all dirty none shm)
    else
        echo "iocache serve has no --persistence yet: running wt only"
    fi
fi

tests=()
for mode in "${modes[@]}"; do
    case "$mode" in
        wt) tests+=(crash_write_through) ;;
        wt-cached) tests+=(crash_write_through_with_the_whole_volume_cached) ;;
        all | dirty | none) tests+=("crash_write_back_persistence_$mode") ;;
        shm) tests+=(crash_write_back_with_the_cache_in_memory) ;;
        custom)
            if [[ -z "${IOCACHE_CRASH_ARGS:-}" ]]; then
                echo "custom needs IOCACHE_CRASH_ARGS, e.g. IOCACHE_CRASH_ARGS='--write-policy wt'" >&2
                exit 2
            fi
            tests+=(crash_custom_args)
            ;;
        *)
            echo "unknown mode $mode (wt, wt-cached, all, dirty, none, shm, custom)" >&2
            exit 2
            ;;
    esac
done

log=${CRASH_SOAK_LOG:-$target_dir/crash-soak.log}
mkdir -p "$(dirname "$log")"
echo "==> $iterations iterations of: ${modes[*]} (log: $log)"
started=$(date +%s)
set +e
IOCACHE_CRASH_ITERATIONS=$iterations cargo test --release --test crash -- \
    --include-ignored --exact --nocapture --test-threads=1 "${tests[@]}" 2>&1 |
    tee "$log" |
    awk '
        / #[0-9]+: / { n = $0; sub(/^.* #/, "", n); sub(/:.*/, "", n); if ((n + 1) % 25 == 0) print; next }
        /^crash [^ ]+: seed / { print; next }
        /^crash [^ ]+: [0-9]+ iterations/ { print; next }
        /^test result:|^test .* \.\.\. |panicked|failure|^iteration |^    / { print }
    '
status=${PIPESTATUS[0]}
set -e
echo "==> $(($(date +%s) - started)) s; exit status $status; full log: $log"
exit "$status"
