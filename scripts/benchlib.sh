# shellcheck shell=bash
# Shell helpers the benchmark scripts share, so that the checks which stop a
# script early (a missing trace, a missing tool) are written once. Sourced
# from the repository's root: `. scripts/benchlib.sh`.

# need_trace PATH: stops the script unless the trace file PATH exists.
need_trace() {
    if [[ ! -f "$1" ]]; then
        echo "error: trace $1 not found (see shared/traces/README.md; set TRACE=...)" >&2
        exit 1
    fi
}

# need_tools [--hint TEXT] TOOL...: stops the script unless every TOOL is on
# the PATH (TEXT, e.g. where to get them, ends the error message).
need_tools() {
    local hint=
    if [[ ${1:-} == --hint ]]; then
        hint=$2
        shift 2
    fi
    local tool
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "error: $tool is needed$hint" >&2
            exit 1
        fi
    done
}

# wait_for SOCKET: waits up to 10 s for a Unix socket to appear (a server
# started in the background); fails naming it otherwise.
wait_for() {
    for _ in $(seq 1 200); do
        [ -S "$1" ] && return 0
        sleep 0.05
    done
    echo "no socket $1" >&2
    return 1
}
