#!/usr/bin/env bash
# Fetches the public block I/O trace samples the tests, examples and
# reproductions read, each from where it was published, into DIR
# (default: ../shared/traces beside the repository, where they look),
# and checks each against the SHA-256 the project's copy has. A download
# whose checksum differs is kept as NAME.mismatch and reported; nothing
# already in DIR with the right checksum is fetched again.
#
# Usage: scripts/get-traces.sh [DIR]
#        scripts/get-traces.sh --from DIR2 [DIR]   (copy from a local mirror)
# Then rebuild (`touch crates/iocache-trace/build.rs build.rs`: the first serves the trace and sim crates)
# so the tests that read the samples are no longer compiled as ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
mirror=
if [[ ${1:-} == --from ]]; then
    mirror=$2
    shift 2
fi
dir=${1:-../shared/traces}
mkdir -p "$dir"

gh=https://raw.githubusercontent.com
caffeine=$gh/ben-manes/caffeine/master/simulator/src/main/resources/com/github/benmanes/caffeine/cache/simulator/parser
# name | sha256 | source URL | origin and terms
samples=(
    "arc-P2.lis.zst|ac686282cd29e715066f7370eecf64c36060218537d51483a7834ad6cf400aed|$gh/moka-rs/cache-trace/main/arc/P2.lis.zst|trace P2 of Megiddo & Modha, ARC (FAST'03), republished by moka-rs/cache-trace; released on condition that the ARC paper is cited"
    "msr-hm0-sample.csv|71389b70289e6f03cc84eaeb3b0b537f487b95b36391f137fa369190ee4f8604|$caffeine/snia_cambridge/msr-cambridge1-sample.csv|MSR Cambridge hm_0 (SNIA IOTTA, under SNIA's terms), from Caffeine's simulator resources (Apache-2.0 repository)"
    "systor17-sample.csv.gz|671dd25cb6439202a1e4db4540b17a19dc38cde2f963243e93bc1174ab907853|$caffeine/snia_systor/systor17-traces-sample.csv.gz|SYSTOR'17 traces (SNIA IOTTA, under SNIA's terms), from Caffeine's simulator resources (Apache-2.0 repository)"
    "tencent-cbs-sample.csv.bz2|3e7f77a1a031f99a06c34512e6c8149f089d3901a1a087450786d9973c3e0de0|$caffeine/snia_tencent_block/cloud_storage-sample.bz2|Tencent CBS traces (SNIA IOTTA, under SNIA's terms), from Caffeine's simulator resources (Apache-2.0 repository)"
    "tpcc-small.disksim|404dd97c3fd4bf605c23abb1f57823226d31da9ed5caeb37b01236496a81fa56|$gh/CMU-SAFARI/MQSim/master/traces/tpcc-small.trace|MQSim repository (CMU SAFARI, MIT licence)"
    "wsrch-small.disksim|84ebefd565aeb5db3bb807ef3c609e952aeaa59c4e78e132181059d0c5ea74d1|$gh/CMU-SAFARI/MQSim/master/traces/wsrch-small.trace|MQSim repository (CMU SAFARI, MIT licence)"
    "cloudphysics-w106-sample.csv|987ff2213050e47d24e8ba6e010d4b3127e51aafef6a76a8a6d43d13b9156fa1|$gh/1a1a11a/libCacheSim/develop/data/cloudPhysicsIO.csv|CloudPhysics vscsi trace w106 sample, libCacheSim repository (see its terms)"
)

sha() { sha256sum "$1" | cut -d' ' -f1; }
failed=0
readme="# Sample block I/O traces (fetched by scripts/get-traces.sh)

Cite the source when you report results on them; each keeps its origin's terms
(below as far as the sources state them).

| file | source |
|---|---|"
for entry in "${samples[@]}"; do
    IFS='|' read -r name sum url origin <<<"$entry"
    readme+=$'\n'"| \`$name\` | $origin: $url |"
    target=$dir/$name
    if [[ -f $target && $(sha "$target") == "$sum" ]]; then
        echo "ok       $name (already there)"
        continue
    fi
    tmp=$target.part
    source=${mirror:+$mirror/$name}
    source=${source:-$url}
    if [[ -n $mirror ]]; then
        cp "$mirror/$name" "$tmp"
    elif ! curl -fsSL --retry 2 -o "$tmp" "$url"; then
        echo "FAILED   $name: cannot fetch $url" >&2
        rm -f "$tmp"
        failed=1
        continue
    fi
    if [[ $(sha "$tmp") != "$sum" ]]; then
        mv "$tmp" "$target.mismatch"
        echo "MISMATCH $name: $source has other content (kept as $target.mismatch; expected sha256 $sum)" >&2
        failed=1
        continue
    fi
    mv "$tmp" "$target"
    echo "fetched  $name"
done
printf '%s\n' "$readme" >"$dir/README.md"
echo "traces in $dir"
exit "$failed"
