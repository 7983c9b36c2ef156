#!/usr/bin/env bash
# The speed targets' run (docs/benchmarks.md): scripts/bench-pinned.sh with the bare server
# (tonic and axum with their defaults, no tollgate code), the no-op server and `serve` on the
# memory store, in paired pinned rounds over gRPC and HTTP, then each loaded open loop at half
# its median closed-loop throughput for its p99. Every setting of bench-pinned.sh applies
# (docs/measuring.md); this only changes two defaults.
#
# Usage: scripts/bench-ceiling.sh
#        ROUNDS=3 DURATION=3s scripts/bench-ceiling.sh
#        SERVERS="bare noop memory redis" scripts/bench-ceiling.sh
set -euo pipefail
export SERVERS="${SERVERS:-bare noop memory}"
export OPEN_RATE="${OPEN_RATE:-0.5}"
exec "$(dirname "$0")/bench-pinned.sh" "$@"
