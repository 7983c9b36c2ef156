# Shared by the benchmark scripts (sourced, not run): builds the release binary, starts one
# redis-server on a free loopback port, and stops every process listed in PIDS on exit.
#
# Sets ROOT, BIN, TMP, PIDS, REDIS_PORT and REDIS_PID.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/tollgate
TMP=$(mktemp -d)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

echo "building the release binary..." >&2
(cd "$ROOT" && cargo build --release -p tollgate-cli >&2)

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --logfile "$TMP/redis.log" &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
