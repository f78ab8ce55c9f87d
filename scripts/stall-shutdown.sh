#!/usr/bin/env bash
# How long SIGTERM takes when the NBD backend stalls every write (not run
# by CI): an nbdkit file export behind the delay filter (writes take an
# hour), iocache in write-back over it, 1 MiB written and flushed by
# qemu-io, then SIGTERM. Prints the exit status, the time to exit and the
# server's last lines. Needs nbdkit and qemu-io.
#
#   scripts/stall-shutdown.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet
bin=$PWD/${CARGO_TARGET_DIR:-target}/release/iocache
dir=$(mktemp -d /tmp/iocache-stall.XXXXXX)
trap 'kill "${kit:-}" 2>/dev/null || true; rm -rf "$dir"' EXIT
truncate -s 64M "$dir/backend.img"
nbdkit -f -U "$dir/kit.sock" --filter=delay file "$dir/backend.img" delay-write=3600 &
kit=$!
while [[ ! -S "$dir/kit.sock" ]]; do sleep 0.05; done
"$bin" serve --backend "nbd+unix:///?socket=$dir/kit.sock" --cache "$dir/cache.img" --cache-size 8MiB \
    --socket "$dir/nbd.sock" --admin-socket "$dir/admin.sock" --write-policy wb --init >"$dir/log" 2>&1 &
server=$!
qemu-io -f raw -c 'write -P 0x5a 0 1M' -c flush "nbd+unix:///?socket=$dir/nbd.sock" >/dev/null
start=$(date +%s.%N)
kill -TERM "$server"
status=0
wait "$server" || status=$?
end=$(date +%s.%N)
echo "exit status $status, $(python3 -c "print(f'{$end - $start:.1f}')") s after SIGTERM"
tail -4 "$dir/log"
