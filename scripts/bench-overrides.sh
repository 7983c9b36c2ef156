#!/usr/bin/env bash
# The time to set N runtime overrides through the admin API, one `PUT` at a time and in one bulk
# `PUT /v1/admin/overrides/bulk`, against a `tollgate serve` pinned to SERVER_CPU with the client
# (one keep-alive connection, Python's http.client) on LOAD_CPU. Each round starts a fresh
# server for each way of setting them, in an order that alternates from round to round; the
# summary gives the medians over the rounds with their range, and, for one by one, the time
# of the first and of the last 1,000 sets (a set used to copy every override before it).
#
# Usage: scripts/bench-overrides.sh
# Environment (defaults in brackets): N [20000], ROUNDS [3], STORE [memory] (or `redis`: a
#   redis-server pinned to LOAD_CPU, so every set is also shared through it), SERVER_CPU [0],
#   LOAD_CPU [1].
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-20000}"
ROUNDS="${ROUNDS:-3}"
STORE="${STORE:-memory}"
SERVER_CPU="${SERVER_CPU:-0}"
LOAD_CPU="${LOAD_CPU:-1}"
command -v taskset >/dev/null || { echo "$(basename "$0"): taskset is required" >&2; exit 2; }
# shellcheck source=bench-common.sh
source scripts/bench-common.sh

cat >"$TMP/policy.yaml" <<'YAML'
domain: api
descriptors:
  - key: tenant
    rate_limit: {name: per_tenant, unit: hour, requests_per_unit: 100}
YAML

# run WAY: starts a server, sets N overrides WAY (`single` or `bulk`), prints the client's line.
run() {
  local way=$1 out="$TMP/out" err="$TMP/err" store=()
  if [ "$STORE" = redis ]; then
    redis-cli -p "$REDIS_PORT" flushall >/dev/null
    store=(--store "redis://127.0.0.1:$REDIS_PORT")
  fi
  local admin_port
  admin_port=$(free_port)
  taskset -c "$SERVER_CPU" "$BIN" serve --config "$TMP/policy.yaml" --grpc-addr 127.0.0.1:0 \
    --http-addr 127.0.0.1:0 --admin-addr "127.0.0.1:$admin_port" "${store[@]}" >"$out" 2>"$err" &
  local pid=$!
  PIDS+=("$pid")
  wait_started "$out" "$err"
  for _ in $(seq 100); do grep -q "^admin listening on " "$out" && break; sleep 0.05; done
  timeout 600 taskset -c "$LOAD_CPU" python3 - "$admin_port" "$way" "$N" <<'PY'
import http.client, json, sys, time
port, way, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
conn = http.client.HTTPConnection("127.0.0.1", port)
headers = {"Content-Type": "application/json"}
def one(i):
    return {"domain": "api", "rule": "per_tenant", "requests_per_unit": 1000,
            "entries": [{"key": "tenant", "value": f"tenant-{i:08}"}]}
def put(path, body):
    conn.request("PUT", path, json.dumps(body), headers)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        sys.exit(f"{path}: {r.status} {data[:200]!r}")
start = time.perf_counter()
marks = []
if way == "single":
    for i in range(n):
        if i % 1000 == 0:
            marks.append(time.perf_counter())
        put("/v1/admin/overrides", one(i))
    marks.append(time.perf_counter())
else:
    put("/v1/admin/overrides/bulk", {"overrides": [one(i) for i in range(n)]})
total = time.perf_counter() - start
conn.request("GET", "/v1/admin/overrides")
listed = len(json.loads(conn.getresponse().read())["overrides"])
if listed != n:
    sys.exit(f"{listed} listed, {n} set")
first = marks[1] - marks[0] if len(marks) > 2 else 0.0
last = marks[-1] - marks[-2] if len(marks) > 2 else 0.0
print(f"{way} {total:.3f} {first:.3f} {last:.3f}")
PY
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}

results="$TMP/results"
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then order="single bulk"; else order="bulk single"; fi
  for way in $order; do run "$way" | tee -a "$results" >&2; done
done

python3 - "$results" "$N" "$STORE" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
n, store = int(sys.argv[2]), sys.argv[3]
def summary(values):
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"
for way in ("single", "bulk"):
    got = [r for r in rows if r[0] == way]
    if not got:
        continue
    line = f"{store}: {n} overrides set {way}: {summary([float(r[1]) for r in got])}"
    if way == "single":
        line += (f"; first 1000: {summary([float(r[2]) for r in got])},"
                 f" last 1000: {summary([float(r[3]) for r in got])}")
    print(line)
PY
