#!/usr/bin/env bash
# Start-up time after a crash with a warm cache (not run by CI): a 1 GiB
# cache of 4 KiB lines in write-through with persistence `all` is filled by
# reading 1 GiB of random data through the server, made durable with a
# FLUSH, the server is killed with SIGKILL, and the time from the restart to
# its "loaded the cache" line is printed with that line.
#
#   scripts/bench-crash-restart.sh BINARY [cold]
#
# BINARY is an `iocache` binary (e.g. target/release/iocache, or an older
# build to compare with). With `cold`, the page cache is dropped before the
# restart (needs root), so the recovery reads the backend from the disk.
# Files go to a directory under ${TMPDIR:-/var/tmp}, removed afterwards.
# Needs nbdcopy (libnbd-bin) and qemu-io (qemu-utils).
set -euo pipefail

binary=$(realpath "$1")
cold=${2:-}
dir=$(mktemp -d "${TMPDIR:-/var/tmp}/iocache-restart.XXXXXX")
server=
cleanup() {
    [ -n "$server" ] && kill "$server" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
cd "$dir"
uri='nbd+unix:///iocache?socket=s.sock'

head -c $((1 << 30)) /dev/urandom > b.img
truncate -s 2G b.img
"$binary" serve --init --backend b.img --cache c.img --cache-size 1GiB --write-policy wt \
    --socket s.sock --admin-socket a.sock > first.log 2>&1 &
server=$!
for _ in $(seq 100); do [ -S s.sock ] && break; sleep 0.1; done
nbdcopy "$uri" - | head -c $((1 << 30)) > /dev/null || true
qemu-io -f raw -c flush "$uri" > /dev/null
kill -9 "$server"
wait "$server" 2>/dev/null || true
server=
rm -f s.sock a.sock
if [ "$cold" = cold ]; then
    sync
    echo 3 > /proc/sys/vm/drop_caches
fi

started=$(date +%s.%N)
"$binary" serve --backend b.img --cache c.img --write-policy wt \
    --socket s.sock --admin-socket a.sock > restart.log 2>&1 &
server=$!
until grep -q "loaded the cache" restart.log; do
    kill -0 "$server" 2>/dev/null || { cat restart.log; exit 1; }
    sleep 0.02
done
loaded=$(date +%s.%N)
printf 'restart to loaded: %.2f s: %s\n' "$(echo "$loaded - $started" | bc)" \
    "$(grep -o 'recovered): .*' restart.log)"
