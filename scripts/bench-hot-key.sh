#!/usr/bin/env bash
# One hot key, three tollgate replicas, one Redis, pinned: the per-request Redis path against
# the prefilter and local budgets, what each costs Redis and the servers per decision, and how
# far local budgets drift from the limit. The replicas run on one core (SERVER_CPU) with one
# tokio worker each; the load generator `tollgate bench` AND redis-server share the other
# (LOAD_CPU). Each round runs every scenario once, in an order that rotates from round to
# round, each on a key of its own (`hot-rROUND`), so no round inherits another's counters.
# Method: docs/measuring.md ("Pinned server rounds") and docs/benchmarks.md ("Redis path").
#
#   per run:   decisions/s, p99, Redis CPU per decision ((utime + stime) of redis-server from
#              /proc/PID/stat over the run / decisions), Redis's script calls (FCALL, EVALSHA, EVAL) and
#              usec_per_call (INFO commandstats after CONFIG RESETSTAT), the replicas' CPU per
#              decision (summed), prefilter answers, local-budget admissions, store errors;
#   summary:   per scenario the medians over the rounds with their range, the ratios of the
#              targets paired round by round, and the drift of each binding rule.
#
# Usage: scripts/bench-hot-key.sh
# Environment (defaults in brackets):
#   ROUNDS [3] (at most 20), DURATION [5s] (at most 60 s), CONCURRENCY [256], SERVER_CPU [0],
#   LOAD_CPU [1], SCENARIOS [all]  words among: ceiling per-call coalesced budgets drift rate
#   exhausted (the `drift` and `rate` words stand for their three and four rules)
# Everything listens on 127.0.0.1 ports the kernel chooses, the generator targets only those,
# every run is under `timeout`, and every process started is stopped on exit.
set -euo pipefail

ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5s}"
CONCURRENCY="${CONCURRENCY:-256}"
SERVER_CPU="${SERVER_CPU:-0}"
LOAD_CPU="${LOAD_CPU:-1}"
SCENARIOS="${SCENARIOS:-ceiling per-call coalesced budgets drift rate exhausted}"

me="$(basename "$0")"
# shellcheck source=scripts/bench-settings.sh
source "$(dirname "$0")/bench-settings.sh"
check_rounds_and_durations
for v in CONCURRENCY SERVER_CPU LOAD_CPU; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || fail "$v must be a number, got '${!v}'"
done
for s in $SCENARIOS; do
  case "$s" in ceiling|per-call|coalesced|budgets|drift|rate|exhausted) ;; *) fail "unknown scenario '$s'" ;; esac
done
command -v taskset >/dev/null || fail "taskset is required"
[ "$(nproc --all)" -ge 2 ] || fail "two cores are needed (one for the replicas, one for the load and Redis)"

# shellcheck source=scripts/bench-common.sh
source "$(dirname "$0")/bench-common.sh"
# bench-common starts redis-server unpinned: move it (every thread) to the generator's core.
taskset -a -p -c "$LOAD_CPU" "$REDIS_PID" >/dev/null
hz="$(getconf CLK_TCK)"

# `plain` asks Redis for every request; `budgeted` uses local budgets; `tight` is exhausted
# after 1000 requests (the prefilter's case); the `*_drift` rules bind during the run.
cat >"$TMP/policy.yaml" <<'EOF'
domain: hot
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: gcra}
  - key: budgeted
    rate_limit: {unit: hour, requests_per_unit: 1000000000, algorithm: gcra, local_budget: 500}
  - key: tight
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: fixed_drift
    rate_limit: {unit: hour, requests_per_unit: 20000, local_budget: 200}
  - key: gcra_drift
    rate_limit: {unit: hour, requests_per_unit: 20000, algorithm: gcra, local_budget: 200}
  - key: sliding_drift
    rate_limit: {unit: hour, requests_per_unit: 20000, algorithm: sliding_window_counter, local_budget: 200}
  # 1000 per second, with and without local budgets: the drift while the rate binds.
  - key: gcra_rate
    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: gcra}
  - key: gcra_rate_budget
    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: gcra, local_budget: 50}
  - key: sliding_rate
    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: sliding_window_counter}
  - key: sliding_rate_budget
    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: sliding_window_counter, local_budget: 50}
EOF

export TOKIO_WORKER_THREADS=1
declare -A SET_PIDS SET_TARGETS SET_METRICS
# start_set NAME [ceiling | serve flags...]: three replicas pinned to SERVER_CPU.
start_set() {
  local name="$1" i; shift
  local outs=()
  for i in 1 2 3; do
    if [ "${1:-}" = ceiling ]; then
      RUST_LOG=warn taskset -c "$SERVER_CPU" "$BIN" bench-server --http-addr 127.0.0.1:0 \
        --grpc-addr 127.0.0.1:0 >"$TMP/$name$i.out" 2>"$TMP/$name$i.err" &
    else
      RUST_LOG=warn taskset -c "$SERVER_CPU" "$BIN" serve --config "$TMP/policy.yaml" \
        --store "redis://127.0.0.1:$REDIS_PORT" --store-timeout 100ms --http-addr 127.0.0.1:0 \
        --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 "$@" >"$TMP/$name$i.out" 2>"$TMP/$name$i.err" &
    fi
    PIDS+=($!)
    SET_PIDS[$name]="${SET_PIDS[$name]:-} $!"
    outs+=("$TMP/$name$i.out")
  done
  for i in 1 2 3; do
    wait_started "$TMP/$name$i.out" "$TMP/$name$i.err"
    SET_TARGETS[$name]="${SET_TARGETS[$name]:-} --target=grpc://$(sed -n 's/^grpc listening on //p' "$TMP/$name$i.out")"
    SET_METRICS[$name]="${SET_METRICS[$name]:-} http://$(sed -n 's/^http listening on //p' "$TMP/$name$i.out")/metrics"
  done
}

# Scenarios: NAME|SET|DESCRIPTOR KEY (the value is hot-rROUND).
all=()
for s in $SCENARIOS; do
  case "$s" in
    ceiling) all+=("ceiling: no-op servers|ceiling|plain") ;;
    per-call) all+=("per-request, one script call each|percall|plain") ;;
    coalesced) all+=("per-request, coalesced (default)|default|plain") ;;
    budgets) all+=("local budgets (500)|default|budgeted") ;;
    drift) all+=("drift: fixed window|default|fixed_drift" "drift: gcra|default|gcra_drift"
      "drift: sliding window counter|default|sliding_drift") ;;
    rate) all+=("rate: gcra 1000/s|default|gcra_rate" "rate: gcra 1000/s, local budget 50|default|gcra_rate_budget"
      "rate: sliding counter 1000/s|default|sliding_rate"
      "rate: sliding counter 1000/s, local budget 50|default|sliding_rate_budget") ;;
    exhausted) all+=("exhausted key, no prefilter|noprefilter|tight" "exhausted key, prefilter|default|tight") ;;
  esac
done
needed=" $(for s in "${all[@]}"; do s="${s#*|}"; echo "${s%%|*}"; done | sort -u | tr '\n' ' ')"
case "$needed" in *" ceiling "*) start_set ceiling ceiling ;; esac
case "$needed" in *" percall "*) start_set percall --store-batch 0 ;; esac
case "$needed" in *" default "*) start_set default ;; esac
case "$needed" in *" noprefilter "*) start_set noprefilter --no-prefilter ;; esac

pticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
set_ticks() { local t=0 p; for p in ${SET_PIDS[$1]}; do t=$((t + $(pticks "$p"))); done; echo "$t"; }
# Sum of an unlabelled counter over a set's replicas (0 for the no-op servers).
metric_sum() {
  local total=0 v url
  for url in ${SET_METRICS[$1]}; do
    v=$(curl -s "$url" 2>/dev/null | sed -n "s/^$2 //p" || true)
    total=$((total + ${v:-0}))
  done
  echo "$total"
}
counters="tollgate_store_errors_total tollgate_prefilter_denials_total tollgate_local_budget_admissions_total"

# run ROUND NAME SET KEY OUT
run() {
  local round="$1" name="$2" set="$3" key="$4" out="$5" c s0 s1 r0 r1 stats
  local before=() after=()
  for c in $counters; do before+=("$(metric_sum "$set" "$c")"); done
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  s0="$(set_ticks "$set")"; r0="$(pticks "$REDIS_PID")"
  # shellcheck disable=SC2086
  timeout $((run_s + 30)) taskset -c "$LOAD_CPU" "$BIN" bench ${SET_TARGETS[$set]} --domain hot \
    --descriptor "$key=hot-r$round" --keys 1 --concurrency "$CONCURRENCY" \
    --duration "$DURATION" --json >"$TMP/run.json"
  s1="$(set_ticks "$set")"; r1="$(pticks "$REDIS_PID")"
  for c in $counters; do after+=("$(metric_sum "$set" "$c")"); done
  stats="$(redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\(fcall\|evalsha\|eval\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\2 \3/p' |
    awk '{ c += $1; u += $2 } END { print c + 0, u + 0 }')"
  python3 - "$TMP/run.json" "$name" "$round" "$hz" $((s1 - s0)) $((r1 - r0)) "$stats" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "${before[@]}" "${after[@]}" >"$out" <<'PY'
import json, sys
path, name, rnd, hz, server, redis, stats, load = sys.argv[1:9]
before, after = sys.argv[9:12], sys.argv[12:15]
errors, prefiltered, local = (int(a) - int(b) for a, b in zip(after, before))
calls, usec = map(int, stats.split())
r = json.load(open(path))
n = max(r["requests"], 1)
hz = int(hz)
r.update(name=name, round=int(rnd), store_errors=errors, prefiltered=prefiltered, local=local,
         redis_us=int(redis) / hz * 1e6 / n, server_us=int(server) / hz * 1e6 / n,
         evalsha_calls=calls, evalsha_usec_per_call=usec / max(calls, 1), load=load)
print(json.dumps(r))
PY
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty')"
echo "# 3 replicas on CPU $SERVER_CPU, generator and redis-server on CPU $LOAD_CPU, one tokio worker each"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# gRPC, --keys 1 --concurrency $CONCURRENCY over the 3 replicas; $ROUNDS rounds of $DURATION"
echo
n="${#all[@]}"
for round in $(seq "$ROUNDS"); do
  for i in $(seq 0 $((n - 1))); do
    s="${all[$(( (round - 1 + i) % n ))]}"
    name="${s%%|*}"; rest="${s#*|}"; set="${rest%%|*}"; key="${rest#*|}"
    echo "round $round: $name" >&2
    run "$round" "$name" "$set" "$key" "$TMP/run.$round.$i.json"
  done
done
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

python3 - "$TMP" "$ROUNDS" "$n" <<'PY'
import glob, json, statistics, sys
tmp, rounds, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = [json.load(open(p)) for p in sorted(glob.glob(f"{tmp}/run.*.json"))]
names = list(dict.fromkeys(r["name"] for r in sorted(rows, key=lambda r: r["round"])))
by = {name: sorted((r for r in rows if r["name"] == name), key=lambda r: r["round"]) for name in names}
def mr(values, fmt):
    values = sorted(values)
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"
print("| scenario | decisions/s | p99 ms | Redis CPU µs/decision | replicas' CPU µs/decision "
      "| script calls per 1000 decisions | script µs/call | prefilter answers | local-budget admissions | errors | store errors |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name in names:
    rs = by[name]
    print("| %s | %s | %s | %s | %s | %s | %s | %d | %d | %d | %d |" % (
        name, mr([r["throughput_rps"] for r in rs], lambda v: f"{v:,.0f}"),
        mr([r["latency_us"]["p99"] / 1000 for r in rs], lambda v: f"{v:.2f}"),
        mr([r["redis_us"] for r in rs], lambda v: f"{v:.2f}"),
        mr([r["server_us"] for r in rs], lambda v: f"{v:.1f}"),
        mr([r["evalsha_calls"] * 1000 / max(r["requests"], 1) for r in rs], lambda v: f"{v:.1f}"),
        mr([r["evalsha_usec_per_call"] for r in rs], lambda v: f"{v:.0f}"),
        sum(r["prefiltered"] for r in rs), sum(r["local"] for r in rs),
        sum(r["errors"] for r in rs), sum(r["store_errors"] for r in rs)))
print()
def paired(a, b, field="throughput_rps"):
    if a not in by or b not in by:
        return None
    return mr([x[field] / max(y[field], 1e-9) for x, y in zip(by[a], by[b])], lambda v: f"{v:.2f}")
for a, b, what in [
    ("local budgets (500)", "per-request, coalesced (default)", "throughput"),
    ("local budgets (500)", "per-request, one script call each", "throughput"),
    ("exhausted key, prefilter", "exhausted key, no prefilter", "throughput"),
    ("local budgets (500)", "ceiling: no-op servers", "throughput"),
    ("per-request, coalesced (default)", "ceiling: no-op servers", "throughput"),
]:
    v = paired(a, b)
    if v:
        print(f"- {a} / {b}, {what}, paired by round: {v}")
for a, b in [("per-request, coalesced (default)", "local budgets (500)"),
             ("exhausted key, no prefilter", "exhausted key, prefilter")]:
    if a in by and b in by:
        ratios = [x["redis_us"] / y["redis_us"] for x, y in zip(by[a], by[b]) if y["redis_us"] > 0]
        if ratios:
            print(f"- Redis CPU per decision, {a} / {b}: {mr(ratios, lambda v: f'{v:.0f}')}x")
        else:
            print(f"- Redis CPU per decision for {b}: below one clock tick over every run")
drift = [name for name in names if name.startswith("drift")]
if drift:
    print()
    print("Drift with local_budget 200, 3 replicas (limit 20000 per hour; rate 5.6/s), per round:")
    for name in drift:
        overs = []
        for r in by[name]:
            exact = 20000 + (int(20000 / 3600 * r["elapsed_s"]) if "gcra" in name else 0)
            overs.append(r["ok"] - exact)
        # docs/hot-keys.md: 0 for a fixed window, R*s for the sliding algorithms,
        # min(R*s, rate*ttl) for GCRA (ttl 100 ms).
        bound = 0 if "fixed" in name else (min(3 * 200, 20000 / 3600 * 0.1) if "gcra" in name else 3 * 200)
        print(f"- {name[7:]}: admitted minus the algorithm alone: {overs} (bound {bound:.2g}; "
              f"under by at most {3 * 200} while leases live)")
rate = [(a, b) for a, b in [("gcra", "min(3*50, 1000*0.1) = 100"), ("sliding counter", "3*50 = 150 per window")]
        if f"rate: {a} 1000/s" in by and f"rate: {a} 1000/s, local budget 50" in by]
if rate:
    print()
    print("While a rate of 1000/s binds (local_budget 50, ttl 100ms, 3 replicas), admitted per second:")
    for algorithm, bound in rate:
        plain = [r["ok"] / r["elapsed_s"] for r in by[f"rate: {algorithm} 1000/s"]]
        budget = [r["ok"] / r["elapsed_s"] for r in by[f"rate: {algorithm} 1000/s, local budget 50"]]
        print(f"- {algorithm}: without budgets {mr(plain, lambda v: f'{v:.0f}')}/s, with "
              f"{mr(budget, lambda v: f'{v:.0f}')}/s; bound on the excess {bound}")
loads = [r["load"] for r in rows]
print(f"\nload averages at the ends of the runs: {min(loads)} … {max(loads)}")
PY
