#!/usr/bin/env bash
# The ceiling measurement of docs/benchmarks.md: `tollgate serve` (memory store) against
# `tollgate bench-server` (the no-op server on the same stack), both loaded by `tollgate bench`
# on this machine, over gRPC and HTTP.
#
#   1. closed loop, RUNS times, alternating ceiling / real: max throughput at the same
#      concurrency, and the ratio real / ceiling (target >= 0.85);
#   2. open loop (--rate) at half the real server's median max: its p99 (target < 1 ms).
#
# Usage: scripts/bench-ceiling.sh
# Environment (defaults in brackets): RUNS [3], DURATION [5s], KEYS [10000],
#   GRPC_CONCURRENCY [64], GRPC_CONNECTIONS [2], HTTP_CONCURRENCY [32], HTTP_CONNECTIONS [32].
# Everything listens on 127.0.0.1 ports chosen by the kernel; servers are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${RUNS:-3}"
DURATION="${DURATION:-5s}"
KEYS="${KEYS:-10000}"
GRPC_CONCURRENCY="${GRPC_CONCURRENCY:-64}"
GRPC_CONNECTIONS="${GRPC_CONNECTIONS:-2}"
HTTP_CONCURRENCY="${HTTP_CONCURRENCY:-32}"
HTTP_CONNECTIONS="${HTTP_CONNECTIONS:-32}"

# field EXPR FILE...: EXPR (Python, over the report `d`) for each JSON report, one per line.
field() {
  python3 -c 'import json, sys
for path in sys.argv[2:]:
    d = json.load(open(path))
    print(eval(sys.argv[1]))' "$@"
}

cargo build --release -j 2 -p tollgate-cli >&2
# Where cargo builds (CARGO_TARGET_DIR, or a target-dir set in a cargo config).
bin="$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/tollgate"

. "$(dirname "$0")/bench-servers.sh"

start ceiling "$bin" bench-server
start real "$bin" serve --config "$work/policy.yaml" --admin-addr 127.0.0.1:0

# bench PROTOCOL SERVER [--rate R]: one run, its JSON report on stdout, with the server's CPU
# time per request added as `server_cpu_us_per_request`.
bench() {
  local protocol="$1" server="$2"; shift 2
  local c k
  if [ "$protocol" = grpc ]; then c="$GRPC_CONCURRENCY"; k="$GRPC_CONNECTIONS"
  else c="$HTTP_CONCURRENCY"; k="$HTTP_CONNECTIONS"; fi
  local before after
  before="$(ticks "$server")"
  timeout 120 "$bin" bench --target "$protocol://$(addr "$server" "$protocol")" --domain bench \
    --descriptor 'user=u{key}' --keys "$KEYS" --concurrency "$c" --connections "$k" \
    --duration "$DURATION" --json "$@" >"$work/last.json"
  after="$(ticks "$server")"
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
ticks, hz = int(sys.argv[2]), int(sys.argv[3])
d["server_cpu_us_per_request"] = round(ticks / hz * 1e6 / max(d["requests"], 1), 1)
print(json.dumps(d))' "$work/last.json" $((after - before)) "$hz"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s–%s", lo, hi }'; }

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
echo "# $(nproc) CPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# gRPC: concurrency $GRPC_CONCURRENCY, $GRPC_CONNECTIONS channels; HTTP: concurrency $HTTP_CONCURRENCY, $HTTP_CONNECTIONS connections; $KEYS keys; $DURATION per run"
echo
printf '%-5s %-4s %-8s %12s %9s %9s %8s %12s\n' proto run server req/s p50_us p99_us errors cpu_us/req
for run in $(seq "$RUNS"); do
  for protocol in grpc http; do
    # Alternate which server goes first, so a slow spell on the shared cores hits both.
    if [ $((run % 2)) = 1 ]; then order="ceiling real"; else order="real ceiling"; fi
    for server in $order; do
      bench "$protocol" "$server" >"$work/$protocol.$server.$run.json"
      field '"\t".join(map(str, [int(d["throughput_rps"]), d["latency_us"]["p50"], d["latency_us"]["p99"], d["errors"], d["server_cpu_us_per_request"]]))' \
        "$work/$protocol.$server.$run.json" | awk -F'\t' -v p="$protocol" -v r="$run" -v s="$server" \
        '{ printf "%-5s %-4s %-8s %12s %9s %9s %8s %12s\n", p, r, s, $1, $2, $3, $4, $5 }'
    done
  done
done

echo
printf '%-5s %-8s %s\n' proto "open" "loop at half the real server's median max"
for protocol in grpc http; do
  real_max="$(field 'd["throughput_rps"]' "$work/$protocol".real.*.json | median)"
  rate="$(awk -v m="$real_max" 'BEGIN { printf "%d", m / 2 }')"
  echo "$rate" >"$work/$protocol.rate"
  for run in $(seq "$RUNS"); do
    bench "$protocol" real --rate "$rate" >"$work/$protocol.open.$run.json"
    echo "$protocol  run $run  rate $rate/s: $(field '"{} req/s  p50 {} µs  p90 {} µs  p99 {} µs  p99.9 {} µs  errors {}".format(int(d["throughput_rps"]), d["latency_us"]["p50"], d["latency_us"]["p90"], d["latency_us"]["p99"], d["latency_us"]["p99_9"], d["errors"])' \
      "$work/$protocol.open.$run.json")"
  done
done

echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| protocol | ceiling req/s (median, range) | tollgate req/s (median, range) | ratio (median, range) | ≥ 0.85 | server CPU µs/req, ceiling / tollgate (medians) | open-loop rate | p99 µs (median, range) | < 1 ms |"
echo "|---|---|---|---|---|---|---|---|---|"
for protocol in grpc http; do
  ceiling="$(field 'int(d["throughput_rps"])' "$work/$protocol".ceiling.*.json)"
  real="$(field 'int(d["throughput_rps"])' "$work/$protocol".real.*.json)"
  ratios="$(for run in $(seq "$RUNS"); do
    paste <(field 'd["throughput_rps"]' "$work/$protocol.ceiling.$run.json") \
      <(field 'd["throughput_rps"]' "$work/$protocol.real.$run.json") |
      awk '{ printf "%.3f\n", $2 / $1 }'
  done)"
  p99s="$(field 'd["latency_us"]["p99"]' "$work/$protocol".open.*.json)"
  ratio_median="$(echo "$ratios" | median)"
  p99_median="$(echo "$p99s" | median)"
  cpu_ceiling="$(field 'd["server_cpu_us_per_request"]' "$work/$protocol".ceiling.*.json | median)"
  cpu_real="$(field 'd["server_cpu_us_per_request"]' "$work/$protocol".real.*.json | median)"
  printf '| %s | %s (%s) | %s (%s) | %s (%s) | %s | %s / %s | %s/s | %s (%s) | %s |\n' "$protocol" \
    "$(echo "$ceiling" | median)" "$(echo "$ceiling" | range)" \
    "$(echo "$real" | median)" "$(echo "$real" | range)" \
    "$ratio_median" "$(echo "$ratios" | range)" \
    "$(awk -v r="$ratio_median" 'BEGIN { print (r >= 0.85) ? "yes" : "no" }')" \
    "$cpu_ceiling" "$cpu_real" \
    "$(cat "$work/$protocol.rate")" "$p99_median" "$(echo "$p99s" | range)" \
    "$(awk -v p="$p99_median" 'BEGIN { print (p < 1000) ? "yes" : "no" }')"
done
