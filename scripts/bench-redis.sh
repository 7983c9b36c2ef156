#!/usr/bin/env bash
# The Redis path, pinned: what one decision costs Redis and the server, per algorithm and per
# coalescing setting, in paired rounds. `tollgate serve` runs on one core (SERVER_CPU) with one
# tokio worker; the load generator `tollgate bench` AND redis-server share the other (LOAD_CPU).
# Each round loads every (algorithm, server) pair once, in an order that rotates from round to
# round, so a slow spell of the shared machine falls on each in turn. Method: docs/measuring.md
# ("Pinned server rounds") and docs/benchmarks.md ("Redis path").
#
#   per run:   decisions/s, p99, Redis CPU per decision ((utime + stime) of redis-server from
#              /proc/PID/stat over the run / decisions), Redis's script calls (FCALL, and EVALSHA or EVAL
#              where Redis refuses functions) and their usec_per_call
#              (INFO commandstats after CONFIG RESETSTAT) and so decisions per call, the server's
#              CPU per decision and the share of its core it used, store errors (a run with any
#              answered by the failure posture is flagged: its figures are not the store's);
#   summary:   per algorithm and server, the medians over the rounds with their range, and with
#              BASE_BIN each server's Redis CPU per decision over its base's, paired by round.
#
# Usage: scripts/bench-redis.sh
# Environment (defaults in brackets):
#   ALGORITHMS ["fixed_window sliding_window_counter gcra sliding_window_log token_bucket
#              leaky_bucket"]  one rule each, 1000 a second, `user` keys
#   BATCHES ["default 1"]      one server per word: `default` runs serve's coalescing defaults,
#                              a number N runs `--store-batch N` (0: one DECIDE call per decision);
#                              either with `@K` after it adds `--store-batches-in-flight K`
#   PROTOCOL [grpc] (grpc or http), ROUNDS [3] (at most 20), DURATION [5s] (at most 60 s),
#   WARMUP [1s] (one unreported run per pair first; 0s skips), KEYS [10000], CONCURRENCY [64],
#   CONNECTIONS [2], SERVER_CPU [0], LOAD_CPU [1],
#   REDIS_CPU [LOAD_CPU]       redis-server's core. Beside the generator, Redis's figures include
#                              what sharing a core costs it (its script time is wall time, so the
#                              generator's turns on the core fall inside its commands); on a core
#                              of its own (REDIS_CPU=1 SERVER_CPU=0 LOAD_CPU=0: the server and the
#                              generator share the other) they are Redis's alone, as on a host of
#                              its own, and the server's are not comparable.
#   BASE_BIN [none]            another build's `tollgate` (the commit compared against): every
#                              server also runs from it, as NAME-base, in the same rotation.
# Everything listens on 127.0.0.1 ports the kernel chooses, the generator targets only those,
# every run is under `timeout`, and every process started is stopped on exit.
set -euo pipefail

ALGORITHMS="${ALGORITHMS:-fixed_window sliding_window_counter gcra sliding_window_log token_bucket leaky_bucket}"
BATCHES="${BATCHES:-default 1}"
PROTOCOL="${PROTOCOL:-grpc}"
ROUNDS="${ROUNDS:-3}"
DURATION="${DURATION:-5s}"
WARMUP="${WARMUP:-1s}"
KEYS="${KEYS:-10000}"
CONCURRENCY="${CONCURRENCY:-64}"
CONNECTIONS="${CONNECTIONS:-2}"
SERVER_CPU="${SERVER_CPU:-0}"
LOAD_CPU="${LOAD_CPU:-1}"
REDIS_CPU="${REDIS_CPU:-$LOAD_CPU}"
BASE_BIN="${BASE_BIN:-}"

me="$(basename "$0")"
# shellcheck source=scripts/bench-settings.sh
source "$(dirname "$0")/bench-settings.sh"
check_rounds_and_durations
case "$PROTOCOL" in grpc|http) ;; *) fail "PROTOCOL must be grpc or http, got '$PROTOCOL'" ;; esac
for a in $ALGORITHMS; do
  case "$a" in
    fixed_window|sliding_window_counter|gcra|sliding_window_log|token_bucket|leaky_bucket) ;;
    *) fail "unknown algorithm '$a'" ;;
  esac
done
for b in $BATCHES; do
  [[ "$b" =~ ^(default|[0-9]+)(@[1-9][0-9]*)?$ ]] || fail "BATCHES: 'default' or a number, optionally with @K after it, got '$b'"
done
for v in KEYS CONCURRENCY CONNECTIONS SERVER_CPU LOAD_CPU REDIS_CPU; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || fail "$v must be a number, got '${!v}'"
done
command -v taskset >/dev/null || fail "taskset is required"
[ -z "$BASE_BIN" ] || [ -x "$BASE_BIN" ] || fail "BASE_BIN is not an executable: $BASE_BIN"
[ "$(nproc --all)" -ge 2 ] || fail "two cores are needed (one for the server, one for the load and Redis)"

# shellcheck source=scripts/bench-common.sh
source "$(dirname "$0")/bench-common.sh"
# bench-common starts redis-server unpinned: move it (every thread) to its core.
taskset -a -p -c "$REDIS_CPU" "$REDIS_PID" >/dev/null
hz="$(getconf CLK_TCK)"

{
  echo "domain: bench"
  echo "descriptors:"
  for a in $ALGORITHMS; do
    echo "  - key: $a"
    echo "    rate_limit: {unit: second, requests_per_unit: 1000, algorithm: $a}"
  done
} >"$TMP/policy.yaml"

export TOKIO_WORKER_THREADS=1
declare -A SPID SOUT
labels=()
# start_server LABEL BINARY BATCH
start_server() {
  local label="$1" binary="$2" batch="${3%@*}" extra=()
  [ "$batch" = default ] || extra=(--store-batch "$batch")
  [[ "$3" != *@* ]] || extra+=(--store-batches-in-flight "${3#*@}")
  RUST_LOG=warn taskset -c "$SERVER_CPU" "$binary" serve --config "$TMP/policy.yaml" \
    --store "redis://127.0.0.1:$REDIS_PORT" --store-timeout 100ms "${extra[@]}" \
    --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
    >"$TMP/$label.out" 2>"$TMP/$label.err" &
  PIDS+=($!)
  SPID[$label]=$!
  SOUT[$label]="$TMP/$label.out"
  labels+=("$label")
}
for b in $BATCHES; do start_server "batch-$b" "$BIN" "$b"; done
if [ -n "$BASE_BIN" ]; then
  for b in $BATCHES; do start_server "batch-$b-base" "$BASE_BIN" "$b"; done
fi
for l in "${labels[@]}"; do wait_started "${SOUT[$l]}" "$TMP/$l.err"; done

pticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
addr() { sed -n "s/^$2 listening on //p" "${SOUT[$1]}"; }
store_errors() {
  curl -s "http://$(addr "$1" http)/metrics" | sed -n 's/^tollgate_store_errors_total //p' | grep . || echo 0
}

# run LABEL ALGORITHM DURATION OUT: one pinned run; its JSON report with the CPU figures added.
run() {
  local label="$1" algorithm="$2" duration="$3" out="$4"
  local s0 s1 r0 r1 e0 e1 stats
  redis-cli -p "$REDIS_PORT" config resetstat >/dev/null
  e0="$(store_errors "$label")"; s0="$(pticks "${SPID[$label]}")"; r0="$(pticks "$REDIS_PID")"
  timeout $((run_s + warm_s + 30)) taskset -c "$LOAD_CPU" "$BIN" bench \
    --target "$PROTOCOL://$(addr "$label" "$PROTOCOL")" --domain bench \
    --descriptor "$algorithm=u{key}" --keys "$KEYS" --concurrency "$CONCURRENCY" \
    --connections "$CONNECTIONS" --duration "$duration" --json >"$TMP/run.json"
  s1="$(pticks "${SPID[$label]}")"; r1="$(pticks "$REDIS_PID")"; e1="$(store_errors "$label")"
  stats="$(redis-cli -p "$REDIS_PORT" info commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_\(fcall\|evalsha\|eval\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\2 \3/p' |
    awk '{ c += $1; u += $2 } END { print c + 0, u + 0 }')"
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
hz, s, r, errors = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
calls, usec = map(int, sys.argv[6].split())
n = max(d["requests"], 1)
d.update(server_cpu_us=s / hz * 1e6 / n, server_core_share=s / hz / max(d["elapsed_s"], 1e-9),
         redis_cpu_us=r / hz * 1e6 / n, evalsha_calls=calls,
         evalsha_usec_per_call=usec / max(calls, 1), evalsha_usec_per_decision=usec / n,
         decisions_per_call=n / max(calls, 1), store_errors=errors, load=sys.argv[7])
print(json.dumps(d))' "$TMP/run.json" "$hz" $((s1 - s0)) $((r1 - r0)) $((e1 - e0)) "$stats" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" >"$out"
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+dirty')${BASE_BIN:+  base $BASE_BIN}"
echo "# serve on CPU $SERVER_CPU, generator on CPU $LOAD_CPU, redis-server on CPU $REDIS_CPU, one tokio worker each"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $PROTOCOL, concurrency $CONCURRENCY on $CONNECTIONS connections, $KEYS keys, 1000/s per key; $ROUNDS rounds of $DURATION, $WARMUP warm-up"
echo

pairs=()
for a in $ALGORITHMS; do for l in "${labels[@]}"; do pairs+=("$a|$l"); done; done
if [ "$warm_s" -gt 0 ]; then
  for p in "${pairs[@]}"; do run "${p#*|}" "${p%%|*}" "$WARMUP" "$TMP/warmup.json"; done
fi
printf '%-5s %-24s %-16s %10s %8s %10s %10s %9s %10s %7s\n' round algorithm server decisions/s \
  p99_us redis_us srv_us per_call script_us errors
for round in $(seq "$ROUNDS"); do
  n="${#pairs[@]}"
  for i in $(seq 0 $((n - 1))); do
    p="${pairs[$(( (round - 1 + i) % n ))]}"
    a="${p%%|*}"; l="${p#*|}"
    out="$TMP/$a.$l.$round.json"
    run "$l" "$a" "$DURATION" "$out"
    python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("%-5s %-24s %-16s %10d %8s %10.2f %10.1f %9.1f %10.1f %7s" % (sys.argv[2], sys.argv[3],
      sys.argv[4], d["throughput_rps"], d["latency_us"]["p99"], d["redis_cpu_us"],
      d["server_cpu_us"], d["decisions_per_call"], d["evalsha_usec_per_call"],
      d["errors"] + d["store_errors"]))' "$out" "$round" "$a" "$l"
  done
done
echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$TMP" "$ROUNDS" "${labels[*]}" "$ALGORITHMS" <<'PY'
import json, statistics, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
labels, algorithms = sys.argv[3].split(), sys.argv[4].split()
with_base = any(l.endswith("-base") for l in labels)
def load(a, l, r):
    return json.load(open(f"{tmp}/{a}.{l}.{r}.json"))
def mr(values, fmt):
    values = sorted(values)
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"
print("| algorithm | server | Redis CPU µs/decision |" + (" Redis CPU / base's, paired |" if with_base else "")
      + " server CPU µs/decision | decisions per call | script µs/call | decisions/s | p99 µs | server core share | posture answers |")
print("|---|---|---|" + ("---|" if with_base else "") + "---|---|---|---|---|---|---|")
flagged = 0
for a in algorithms:
    for l in labels:
        runs = [load(a, l, r) for r in range(1, rounds + 1)]
        paired = ""
        if with_base:
            paired = " — |" if l.endswith("-base") else " %s |" % mr(
                [load(a, l, r)["redis_cpu_us"] / max(load(a, l + "-base", r)["redis_cpu_us"], 1e-9)
                 for r in range(1, rounds + 1)], lambda v: f"{v:.2f}")
        errors = sum(d["store_errors"] + d["errors"] for d in runs)
        flagged += errors
        print("| %s | %s | %s |%s %s | %s | %s | %s | %s | %s | %s |" % (
            a, l, mr([d["redis_cpu_us"] for d in runs], lambda v: f"{v:.2f}"), paired,
            mr([d["server_cpu_us"] for d in runs], lambda v: f"{v:.1f}"),
            mr([d["decisions_per_call"] for d in runs], lambda v: f"{v:.1f}"),
            mr([d["evalsha_usec_per_call"] for d in runs], lambda v: f"{v:.0f}"),
            mr([d["throughput_rps"] for d in runs], lambda v: f"{v:.0f}"),
            mr([d["latency_us"]["p99"] for d in runs], lambda v: f"{v:.0f}"),
            mr([d["server_core_share"] for d in runs], lambda v: f"{v:.2f}"),
            f"{errors} (figures not the store's!)" if errors else "0"))
loads = [load(a, l, r)["load"] for a in algorithms for l in labels for r in range(1, rounds + 1)]
print(f"\nload averages at the ends of the runs: {loads[0]} … {loads[-1]}")
if flagged:
    print(f"\n{flagged} requests failed or fell to the failure posture: read the figures with care",
          file=sys.stderr)
PY
