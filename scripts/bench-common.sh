# Shared by the benchmark scripts (sourced, not run): builds the release binary, starts one
# redis-server on a free loopback port, and stops every process listed in PIDS on exit.
#
# Sets ROOT, BIN, TMP, PIDS, REDIS_PORT and REDIS_PID.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Where cargo builds (CARGO_TARGET_DIR, or a target-dir set in a cargo config).
TARGET_DIR=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
BIN=$TARGET_DIR/release/tollgate
TMP=$(mktemp -d)
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

# wait_started OUT ERR: waits (10 s at most) until a server's stdout OUT says its gRPC listener
# is up; otherwise stops the run with the server's stderr ERR.
wait_started() {
  for _ in $(seq 200); do grep -q "^grpc listening on " "$1" 2>/dev/null && return 0; sleep 0.05; done
  echo "$(basename "$0"): a server did not start:" >&2
  cat "$2" >&2
  exit 2
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# A missing tool must stop the run: without Redis the servers would answer with their failure
# posture, and without curl the store-error column would read 0.
for tool in redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || {
    echo "$(basename "$0"): $tool is required (apt-get install redis-server redis-tools curl)" >&2
    exit 2
  }
done

echo "building the release binary..." >&2
(cd "$ROOT" && cargo build --release -p tollgate-cli >&2)

REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --logfile "$TMP/redis.log" &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 || {
  echo "$(basename "$0"): redis-server did not answer on port $REDIS_PORT" >&2
  exit 2
}
