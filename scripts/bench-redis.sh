#!/usr/bin/env bash
# The Redis-backed decision path against the memory store, with and without coalescing, and
# the coalescing settings (batch window, batches in flight), in one session.
#
#   scripts/bench-redis.sh [SECONDS_PER_RUN] [ROUNDS]      (defaults 5 and 3)
#
# Builds the release binary, starts redis-server and one `tollgate serve` per configuration on
# free loopback ports, then runs `tollgate bench` (gRPC, 10 000 uniform keys, concurrency 64)
# against each in turn, ROUNDS times round-robin, and prints the median of each with the ratio
# to the memory store. A run where any decision fell to the failure posture is flagged: its
# throughput would not be the store's. Everything is stopped on exit.
set -euo pipefail

SECONDS_PER_RUN=${1:-5}
ROUNDS=${2:-3}
# shellcheck source=scripts/bench-common.sh
source "$(dirname "$0")/bench-common.sh"

cat >"$TMP/policy.yaml" <<'EOF'
domain: bench
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: second, requests_per_unit: 1000}
EOF

REDIS="--store redis://127.0.0.1:$REDIS_PORT --store-timeout 100ms"
CONFIGS=(
  "memory|"
  "redis, one call per decision|$REDIS --store-batch 0"
  "redis, coalesced (default: batch 64, 2 in flight, no window)|$REDIS"
  "redis, coalesced, 1 in flight|$REDIS --store-batches-in-flight 1"
  "redis, coalesced, 4 in flight|$REDIS --store-batches-in-flight 4"
  "redis, coalesced, 1 ms window|$REDIS --store-batch-window 1ms"
)
TARGETS=()
METRICS=()
for i in "${!CONFIGS[@]}"; do
  args=${CONFIGS[$i]#*|}
  # shellcheck disable=SC2086
  RUST_LOG=warn "$BIN" serve --config "$TMP/policy.yaml" $args --http-addr 127.0.0.1:0 \
    --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 >"$TMP/s$i.out" 2>"$TMP/s$i.err" &
  PIDS+=($!)
done
for i in "${!CONFIGS[@]}"; do
  for _ in $(seq 100); do grep -q "admin listening" "$TMP/s$i.out" && break; sleep 0.05; done
  TARGETS+=("grpc://$(sed -n 's/^grpc listening on //p' "$TMP/s$i.out")")
  METRICS+=("http://$(sed -n 's/^http listening on //p' "$TMP/s$i.out")/metrics")
done

errors_of() { curl -s "$1" | sed -n 's/^tollgate_store_errors_total //p'; }

: >"$TMP/results.jsonl"
for round in $(seq "$ROUNDS"); do
  for i in "${!CONFIGS[@]}"; do
    name=${CONFIGS[$i]%%|*}
    echo "round $round: $name" >&2
    before=$(errors_of "${METRICS[$i]}")
    "$BIN" bench --target "${TARGETS[$i]}" --domain bench --descriptor 'user={key}' \
      --keys 10000 --concurrency 64 --duration "${SECONDS_PER_RUN}s" --json >"$TMP/run.json"
    after=$(errors_of "${METRICS[$i]}")
    python3 - "$name" "$TMP/run.json" "$((after - before))" "$(uptime)" \
      >>"$TMP/results.jsonl" <<'PY'
import json, sys
name, path, errors, load = sys.argv[1:]
r = json.load(open(path))
r.update(name=name, store_errors=int(errors), load=load.split("load average:")[-1].strip())
print(json.dumps(r))
PY
  done
done
batches=$(curl -s "${METRICS[2]}" | sed -n 's/^tollgate_store_batches_total //p')
decisions=$(curl -s "${METRICS[2]}" | sed -n 's/^tollgate_store_batched_decisions_total //p')

python3 - "$TMP/results.jsonl" "$ROUNDS" "$SECONDS_PER_RUN" "$batches" "$decisions" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds, seconds, batches, decisions = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
names = list(dict.fromkeys(r["name"] for r in rows))
by = {n: [r for r in rows if r["name"] == n] for n in names}
med = lambda n, f: statistics.median(f(r) for r in by[n])
memory = med("memory", lambda r: r["throughput_rps"])
print(f"gRPC, 10 000 uniform keys, concurrency 64, {rounds} rounds of {seconds}s, medians")
print()
print("| configuration | req/s (median) | runs | vs memory | p50 ms | p99 ms | store errors |")
print("|---|---:|---|---:|---:|---:|---:|")
for n in names:
    runs = ", ".join(f"{r['throughput_rps']/1000:.1f}k" for r in by[n])
    t = med(n, lambda r: r["throughput_rps"])
    p50 = med(n, lambda r: r["latency_us"]["p50"]) / 1000
    p99 = med(n, lambda r: r["latency_us"]["p99"]) / 1000
    errors = sum(r["store_errors"] for r in by[n])
    flag = " (posture answered!)" if errors else ""
    print(f"| {n} | {t:,.0f} | {runs} | {t/memory:.0%} | {p50:.2f} | {p99:.2f} | {errors}{flag} |")
print()
if batches:
    print(f"default coalescing: {decisions} decisions in {batches} script calls, {decisions/batches:.1f} per call")
print("load averages during the runs: " + "; ".join(sorted({r['load'] for r in rows})[:3]))
PY
