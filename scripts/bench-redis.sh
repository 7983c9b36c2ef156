#!/usr/bin/env bash
# The Redis-backed decision path against the memory store, with and without coalescing, and
# the coalescing settings (batch window, batches in flight), at several concurrencies, in one
# session.
#
#   scripts/bench-redis.sh [SECONDS_PER_RUN] [ROUNDS] [CONCURRENCIES]   (defaults 5, 3, "64 256")
#
# Builds the release binary, starts redis-server and one `tollgate serve` per configuration on
# free loopback ports, then runs `tollgate bench` (gRPC, 10 000 uniform keys, one channel)
# against each in turn at each concurrency, ROUNDS times round-robin, and prints the median of
# each with the ratio to the memory store at the same concurrency. Beside throughput it reports
# where the two cores went, in CPU µs per request: tollgate, Redis, the load generator, and
# idle time. A run where any decision fell to the failure posture is flagged: its throughput
# would not be the store's. Everything is stopped on exit.
set -euo pipefail

SECONDS_PER_RUN=${1:-5}
ROUNDS=${2:-3}
CONCURRENCIES=${3:-64 256}
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
SERVE_PIDS=()
for i in "${!CONFIGS[@]}"; do
  args=${CONFIGS[$i]#*|}
  # shellcheck disable=SC2086
  RUST_LOG=warn "$BIN" serve --config "$TMP/policy.yaml" $args --http-addr 127.0.0.1:0 \
    --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 >"$TMP/s$i.out" 2>"$TMP/s$i.err" &
  PIDS+=($!)
  SERVE_PIDS+=($!)
done
for i in "${!CONFIGS[@]}"; do
  wait_started "$TMP/s$i.out" "$TMP/s$i.err"
  TARGETS+=("grpc://$(sed -n 's/^grpc listening on //p' "$TMP/s$i.out")")
  METRICS+=("http://$(sed -n 's/^http listening on //p' "$TMP/s$i.out")/metrics")
done

metric() { curl -s "$1" | sed -n "s/^$2 //p" | grep . || echo 0; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
idle_ticks() { awk '/^cpu /{print $5 + $6}' /proc/stat; }
# Counters read before and after each run: store errors, batches, batched decisions, and CPU
# ticks of the server, of Redis and of the idle cores.
sample() {
  echo "$(metric "$1" tollgate_store_errors_total) $(metric "$1" tollgate_store_batches_total)" \
    "$(metric "$1" tollgate_store_batched_decisions_total) $(cpu_ticks "$2")" \
    "$(cpu_ticks "$REDIS_PID") $(idle_ticks)"
}

: >"$TMP/results.jsonl"
for round in $(seq "$ROUNDS"); do
  for concurrency in $CONCURRENCIES; do
    for i in "${!CONFIGS[@]}"; do
      name=${CONFIGS[$i]%%|*}
      echo "round $round, concurrency $concurrency: $name" >&2
      before=$(sample "${METRICS[$i]}" "${SERVE_PIDS[$i]}")
      # The generator's CPU time, from its rusage once it has exited.
      python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], "w"), check=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(u.ru_utime + u.ru_stime)' "$TMP/run.json" "$BIN" bench --target "${TARGETS[$i]}" \
        --domain bench --descriptor 'user={key}' --keys 10000 --concurrency "$concurrency" \
        --duration "${SECONDS_PER_RUN}s" --json >"$TMP/bench.cpu"
      after=$(sample "${METRICS[$i]}" "${SERVE_PIDS[$i]}")
      python3 - "$name" "$concurrency" "$TMP/run.json" "$TMP/bench.cpu" "$before" "$after" \
        "$(uptime)" "$(getconf CLK_TCK)" >>"$TMP/results.jsonl" <<'PY'
import json, sys
name, concurrency, path, bench_cpu, before, after, load, hz = sys.argv[1:]
r = json.load(open(path))
delta = [float(a or 0) - float(b or 0) for a, b in zip(after.split(), before.split())]
errors, batches, batched, server, redis, idle = delta
per_request = lambda ticks: ticks / int(hz) * 1e6 / max(r["requests"], 1)
r.update(
    name=name, concurrency=int(concurrency), store_errors=int(errors),
    batches=int(batches), batched=int(batched),
    cpu_us=dict(server=per_request(server), redis=per_request(redis), idle=per_request(idle),
                bench=float(open(bench_cpu).read()) * 1e6 / max(r["requests"], 1)),
    load=load.split("load average:")[-1].strip(),
)
print(json.dumps(r))
PY
    done
  done
done

python3 - "$TMP/results.jsonl" "$ROUNDS" "$SECONDS_PER_RUN" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
rounds, seconds = sys.argv[2], sys.argv[3]
names = list(dict.fromkeys(r["name"] for r in rows))
print(f"gRPC, 10 000 uniform keys, one channel, {rounds} rounds of {seconds}s, medians")
for c in sorted({r["concurrency"] for r in rows}):
    by = {n: [r for r in rows if r["name"] == n and r["concurrency"] == c] for n in names}
    med = lambda n, f: statistics.median(f(r) for r in by[n])
    memory = med("memory", lambda r: r["throughput_rps"])
    print()
    print(f"concurrency {c}")
    print()
    print("| configuration | req/s (median) | runs | vs memory | p50 ms | p99 ms "
          "| decisions per call | CPU µs/req: tollgate / Redis / generator / idle | store errors |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|")
    for n in names:
        runs = ", ".join(f"{r['throughput_rps']/1000:.1f}k" for r in by[n])
        t = med(n, lambda r: r["throughput_rps"])
        p50 = med(n, lambda r: r["latency_us"]["p50"]) / 1000
        p99 = med(n, lambda r: r["latency_us"]["p99"]) / 1000
        batches = sum(r["batches"] for r in by[n])
        per_call = f"{sum(r['batched'] for r in by[n]) / batches:.1f}" if batches else "—"
        cpu = " / ".join(f"{med(n, lambda r: r['cpu_us'][k]):.1f}"
                         for k in ("server", "redis", "bench", "idle"))
        errors = sum(r["store_errors"] for r in by[n])
        flag = " (posture answered!)" if errors else ""
        print(f"| {n} | {t:,.0f} | {runs} | {t/memory:.0%} | {p50:.2f} | {p99:.2f} "
              f"| {per_call} | {cpu} | {errors}{flag} |")
print()
print("load averages during the runs: " + "; ".join(sorted({r['load'] for r in rows})[:3]))
PY
