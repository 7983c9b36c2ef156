#!/usr/bin/env bash
# A before/after check of a change to the serving stack: two `tollgate` binaries (A, then B),
# each running `bench-server` (the no-op ceiling) and `serve` (memory store), loaded in turn by
# B's `tollgate bench` over one protocol. Prints every run, then the medians: throughput and the
# server's CPU time per request, the steadier measure on a shared machine.
#
# Usage: scripts/bench-ab.sh A_BINARY B_BINARY
#   e.g. git worktree add /tmp/before HEAD~1 && (cd /tmp/before && cargo build --release -p tollgate-cli)
#        scripts/bench-ab.sh /tmp/before/target/release/tollgate target/release/tollgate
# Environment (defaults in brackets): PROTOCOL [http] (or grpc), RUNS [4], DURATION [5s],
#   KEYS [10000], CONCURRENCY [32], CONNECTIONS [32].
# Everything listens on 127.0.0.1 ports chosen by the kernel; servers are stopped on exit.
set -euo pipefail

if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: $(basename "$0") A_BINARY B_BINARY (two built tollgate binaries)" >&2
  exit 2
fi
declare -A bin=([A]="$1" [B]="$2")
PROTOCOL="${PROTOCOL:-http}"
RUNS="${RUNS:-4}"
DURATION="${DURATION:-5s}"
KEYS="${KEYS:-10000}"
CONCURRENCY="${CONCURRENCY:-32}"
CONNECTIONS="${CONNECTIONS:-32}"
case "$PROTOCOL" in http | grpc) ;; *) echo "PROTOCOL is http or grpc" >&2; exit 2 ;; esac

. "$(dirname "$0")/bench-servers.sh"

for side in A B; do
  start "ceiling-$side" "${bin[$side]}" bench-server
  start "serve-$side" "${bin[$side]}" serve --config "$work/policy.yaml" --admin-addr 127.0.0.1:0
done

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  A=${bin[A]}  B=${bin[B]}"
echo "# $(nproc) CPUs; load before: $(cut -d' ' -f1-3 /proc/loadavg); $PROTOCOL, concurrency $CONCURRENCY, $CONNECTIONS connections, $KEYS keys, $DURATION per run"
printf '%-4s %-10s %10s %9s %7s %11s\n' run server req/s p99_us errors cpu_us/req
for run in $(seq "$RUNS"); do
  # Alternate which side goes first, so a slow spell on the shared cores hits both.
  if [ $((run % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for kind in ceiling serve; do
    for side in $order; do
      name="$kind-$side"
      before="$(ticks "$name")"
      timeout 120 "${bin[B]}" bench \
        --target "$PROTOCOL://$(addr "$name" "$PROTOCOL")" \
        --domain bench --descriptor 'user=u{key}' --keys "$KEYS" --concurrency "$CONCURRENCY" \
        --connections "$CONNECTIONS" --duration "$DURATION" --json >"$work/last.json"
      after="$(ticks "$name")"
      python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
cpu = int(sys.argv[2]) / int(sys.argv[3]) * 1e6 / max(d["requests"], 1)
print("%-4s %-10s %10d %9s %7d %11.2f" % (sys.argv[4], sys.argv[5], d["throughput_rps"],
      d["latency_us"]["p99"], d["errors"], cpu))' \
        "$work/last.json" $((after - before)) "$hz" "$run" "$name" | tee -a "$work/runs.txt"
    done
  done
done

echo
echo "| server | A req/s | B req/s | B/A | A CPU µs/req | B CPU µs/req | B−A |"
echo "|---|---|---|---|---|---|---|"
python3 -c 'import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def median(name, column):
    return statistics.median(float(r[column]) for r in rows if r[1] == name)
for kind in ("ceiling", "serve"):
    ra, rb = median(kind + "-A", 2), median(kind + "-B", 2)
    ca, cb = median(kind + "-A", 5), median(kind + "-B", 5)
    print(f"| {kind} | {ra:.0f} | {rb:.0f} | {rb / ra:.3f} | {ca:.2f} | {cb:.2f} | {cb - ca:+.2f} |")' \
  "$work/runs.txt"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
