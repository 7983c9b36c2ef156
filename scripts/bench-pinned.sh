#!/usr/bin/env bash
# Paired server rounds, pinned: each server runs on one core (SERVER_CPU) with one tokio worker,
# the load generator `tollgate bench` on another (LOAD_CPU), so a server's cost is measured as
# CPU time per decision rather than read off a throughput the generator shares a core with.
# Each round loads every server once per protocol, in an order that rotates from round to
# round, so a slow spell of the shared machine falls on each server in turn. The method is in
# docs/measuring.md.
#
#   per run:   throughput (decisions/s), p50/p99 latency, server CPU time per decision
#              ((utime + stime) from /proc/PID/stat over the run / decisions), the share of its
#              core the server used (near 1.0 when the generator saturates it);
#   summary:   per protocol and server, the medians over the rounds with their range, and each
#              server's CPU per decision against the first server's (and the no-op's), paired
#              round by round;
#   open loop: with OPEN_RATE, after the closed rounds, ROUNDS more rounds in which each server is
#              sent OPEN_RATE times its own median closed-loop throughput (`tollgate bench
#              --rate`): its p50/p99 there, whether p99 stayed under 1 ms in every round, and
#              the share of its core the generator used (near 1.0, the tail is the generator's
#              queue as much as the server's).
#
# Usage: scripts/bench-pinned.sh
# Environment (defaults in brackets):
#   SERVERS ["noop memory"]  any of: bare (`tollgate bench-server --bare`: tonic and axum with
#                            their defaults, no tollgate code), noop (`tollgate bench-server`),
#                            memory (`tollgate serve`, memory store), redis (`tollgate serve` on a
#                            redis-server pinned to LOAD_CPU; adds Redis's CPU per decision)
#   PROTOCOLS ["grpc http"], ROUNDS [5] (at most 20), DURATION [5s] (at most 60 s per run),
#   WARMUP [1s] (one unreported run per server and protocol first), KEYS [10000],
#   GRPC_CONCURRENCY [64], GRPC_CONNECTIONS [2], HTTP_CONCURRENCY [32], HTTP_CONNECTIONS [32],
#   SERVER_CPU [0], LOAD_CPU [1],
#   OPEN_RATE [0]            the open-loop rounds' rate, as a fraction of each server's median
#                            closed-loop throughput (0.5: half the maximum); 0 runs none
#   BASE_BIN [none]          another build's `tollgate` (the commit compared against): each server
#                            of SERVERS is also run from it, as KIND-base, in the same rotation,
#                            and each server's CPU per decision is paired with its base's.
# Everything listens on 127.0.0.1 ports the kernel chooses, the generator targets only those,
# every run is under `timeout`, and every process started is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

SERVERS="${SERVERS:-noop memory}"
PROTOCOLS="${PROTOCOLS:-grpc http}"
ROUNDS="${ROUNDS:-5}"
DURATION="${DURATION:-5s}"
WARMUP="${WARMUP:-1s}"
KEYS="${KEYS:-10000}"
GRPC_CONCURRENCY="${GRPC_CONCURRENCY:-64}"
GRPC_CONNECTIONS="${GRPC_CONNECTIONS:-2}"
HTTP_CONCURRENCY="${HTTP_CONCURRENCY:-32}"
HTTP_CONNECTIONS="${HTTP_CONNECTIONS:-32}"
SERVER_CPU="${SERVER_CPU:-0}"
LOAD_CPU="${LOAD_CPU:-1}"
BASE_BIN="${BASE_BIN:-}"
OPEN_RATE="${OPEN_RATE:-0}"

me="$(basename "$0")"
# shellcheck source=scripts/bench-settings.sh
source "$(dirname "$0")/bench-settings.sh"
check_rounds_and_durations
for s in $SERVERS; do case "$s" in bare|noop|memory|redis) ;; *) fail "unknown server '$s'" ;; esac; done
[[ "$OPEN_RATE" =~ ^(0|0?\.[0-9]+|1(\.0*)?)$ ]] || fail "OPEN_RATE must be a fraction from 0 to 1, got '$OPEN_RATE'"
for p in $PROTOCOLS; do case "$p" in grpc|http) ;; *) fail "unknown protocol '$p'" ;; esac; done
for tool in taskset python3; do command -v "$tool" >/dev/null || fail "$tool is required"; done
[ -z "$BASE_BIN" ] || [ -x "$BASE_BIN" ] || fail "BASE_BIN is not an executable: $BASE_BIN"
[ "$(nproc --all)" -ge 2 ] || fail "two cores are needed (one for the servers, one for the load)"
read -ra servers <<<"$SERVERS"
read -ra protocols <<<"$PROTOCOLS"

cargo build --release -j 2 -p tollgate-cli >&2
# Where cargo builds (CARGO_TARGET_DIR, or a target-dir set in a cargo config).
bin="$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/release/tollgate"

. "$(dirname "$0")/bench-servers.sh"

# One tokio worker per process: a server on one core, the generator on the other.
export TOKIO_WORKER_THREADS=1
redis_port=""
# start_kind LABEL KIND BINARY: server KIND run from BINARY, pinned, known as LABEL.
start_kind() {
  local label="$1" kind="$2" binary="$3"
  case "$kind" in
    bare) start "$label" taskset -c "$SERVER_CPU" "$binary" bench-server --bare ;;
    noop) start "$label" taskset -c "$SERVER_CPU" "$binary" bench-server ;;
    memory) start "$label" taskset -c "$SERVER_CPU" "$binary" serve --config "$work/policy.yaml" \
      --admin-addr 127.0.0.1:0 ;;
    redis)
      if [ -z "$redis_port" ]; then
        command -v redis-server >/dev/null || fail "redis-server is required for SERVERS=redis"
        redis_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
        taskset -c "$LOAD_CPU" redis-server --port "$redis_port" --bind 127.0.0.1 --save '' \
          --appendonly no --logfile "$work/redis.log" &
        pid[redis_server]=$!
        for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
        redis-cli -p "$redis_port" ping >/dev/null 2>&1 || fail "redis-server did not answer"
      fi
      start "$label" taskset -c "$SERVER_CPU" "$binary" serve --config "$work/policy.yaml" \
        --admin-addr 127.0.0.1:0 --store "redis://127.0.0.1:$redis_port" ;;
  esac
}
labels=()
for s in "${servers[@]}"; do
  start_kind "$s" "$s" "$bin"
  labels+=("$s")
done
if [ -n "$BASE_BIN" ]; then
  for s in "${servers[@]}"; do
    # The bare server runs no tollgate code: the same from either commit.
    [ "$s" = bare ] && continue
    start_kind "$s-base" "$s" "$BASE_BIN"
    labels+=("$s-base")
  done
fi

# pticks PID: CPU ticks (utime + stime) of process PID so far.
pticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# children_cpu: sets child_cpu to the user and system CPU time of this shell's finished
# children so far (`1m2.500s 0m0.300s`), from the `times` builtin, called without a subshell
# (a subshell's children are its own).
children_cpu() {
  local _shell_user _shell_sys user sys
  times >"$work/times"
  { read -r _shell_user _shell_sys; read -r user sys; } <"$work/times"
  child_cpu="$user $sys"
}

# bench PROTOCOL SERVER DURATION OUT [RATE]: one run of the pinned generator against SERVER
# (closed loop, or open loop at RATE decisions a second); its JSON report with the server's (and
# Redis's) CPU over the run and the load average before it added, in OUT.
bench() {
  local protocol="$1" server="$2" duration="$3" out="$4" rate="${5:-}"
  local load
  load="$(cut -d' ' -f1 /proc/loadavg)"
  local c k s0 s1 r0=0 r1=0
  if [ "$protocol" = grpc ]; then c="$GRPC_CONCURRENCY"; k="$GRPC_CONNECTIONS"
  else c="$HTTP_CONCURRENCY"; k="$HTTP_CONNECTIONS"; fi
  local with_redis=""
  case "$server" in redis|redis-base) with_redis=1 ;; esac
  if [ -n "$with_redis" ]; then
    redis-cli -p "$redis_port" config resetstat >/dev/null
    r0="$(pticks "${pid[redis_server]}")"
  fi
  s0="$(pticks "${pid[$server]}")"
  local g0 g1
  children_cpu; g0="$child_cpu"
  timeout $((run_s + warm_s + 30)) taskset -c "$LOAD_CPU" "$bin" bench \
    --target "$protocol://$(addr "$server" "$protocol")" --domain bench \
    --descriptor 'user=u{key}' --keys "$KEYS" --concurrency "$c" --connections "$k" \
    --duration "$duration" ${rate:+--rate "$rate"} --json >"$work/run.json"
  children_cpu; g1="$child_cpu"
  s1="$(pticks "${pid[$server]}")"
  local evalsha="null"
  if [ -n "$with_redis" ]; then
    r1="$(pticks "${pid[redis_server]}")"
    # The decision scripts' calls: FCALL, or EVALSHA where Redis refuses functions.
    evalsha="$(redis-cli -p "$redis_port" info commandstats | tr -d '\r' |
      sed -n 's/^cmdstat_\(fcall\|evalsha\):calls=\([0-9]*\),usec=\([0-9]*\),.*/\2 \3/p' |
      awk '{ c += $1; u += $2 } END { if (c > 0) printf "%.2f", u / c; else print "null" }')"
  fi
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
hz, s, r = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
n = max(d["requests"], 1)
d["load_before"] = float(sys.argv[6])
d["server_cpu_us"] = round(s / hz * 1e6 / n, 1)
d["server_core_share"] = round(s / hz / max(d["elapsed_s"], 1e-9), 2)
import re
def cpu(times):  # "1m2.500s 0m0.300s": user and system time, in seconds
    return sum(int(m) * 60 + float(s) for m, s in re.findall(r"(\d+)m([\d.]+)s", times))
d["generator_core_share"] = round((cpu(sys.argv[8]) - cpu(sys.argv[7])) / max(d["elapsed_s"], 1e-9), 2)
d["redis_cpu_us"] = round(r / hz * 1e6 / n, 1) if sys.argv[5] != "null" else None
d["redis_evalsha_usec_per_call"] = None if sys.argv[5] == "null" else float(sys.argv[5])
print(json.dumps(d))' "$work/run.json" "$hz" $((s1 - s0)) $((r1 - r0)) "$evalsha" "$load" "$g0" "$g1" >"$out"
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
echo "# $(nproc --all) CPUs; servers on CPU $SERVER_CPU, generator (and Redis) on CPU $LOAD_CPU, one tokio worker each"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# gRPC: concurrency $GRPC_CONCURRENCY, $GRPC_CONNECTIONS channels; HTTP: concurrency $HTTP_CONCURRENCY, $HTTP_CONNECTIONS connections; $KEYS keys; $ROUNDS rounds of $DURATION, $WARMUP warm-up$( [ "$OPEN_RATE" = 0 ] || echo "; open loop at $OPEN_RATE of each server's median max")"
echo

if [ "$warm_s" -gt 0 ]; then
  for protocol in "${protocols[@]}"; do
    for server in "${labels[@]}"; do bench "$protocol" "$server" "$WARMUP" "$work/warmup.json"; done
  done
fi

# line OUT PROTOCOL ROUND SERVER: one run's line of the table.
line() {
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
r = d["redis_cpu_us"]
print("%-5s %-6s %-12s %10d %8s %8s %7s %12s %10s %12s %6s" % (sys.argv[2], sys.argv[3], sys.argv[4],
      d["throughput_rps"], d["latency_us"]["p50"], d["latency_us"]["p99"], d["errors"],
      d["server_cpu_us"], d["server_core_share"], "-" if r is None else r, d["load_before"]))' "$@"
}
printf '%-5s %-6s %-12s %10s %8s %8s %7s %12s %10s %12s %6s\n' proto round server decisions/s p50_us \
  p99_us errors cpu_us/dec core_share redis_us/dec load
for round in $(seq "$ROUNDS"); do
  for protocol in "${protocols[@]}"; do
    # Rotate the order: round r starts with server (r - 1) mod n.
    n="${#labels[@]}"
    for i in $(seq 0 $((n - 1))); do
      server="${labels[$(( (round - 1 + i) % n ))]}"
      out="$work/$protocol.$server.$round.json"
      bench "$protocol" "$server" "$DURATION" "$out"
      line "$out" "$protocol" "$round" "$server"
    done
  done
done

# Open loop: each server at OPEN_RATE of its own median closed-loop throughput, rounds rotated.
if [ "$OPEN_RATE" != 0 ]; then
  for round in $(seq "$ROUNDS"); do
    for protocol in "${protocols[@]}"; do
      n="${#labels[@]}"
      for i in $(seq 0 $((n - 1))); do
        server="${labels[$(( (round - 1 + i) % n ))]}"
        rate="$(python3 -c 'import json, statistics, sys
w, p, s, rounds, f = sys.argv[1:6]
m = statistics.median(json.load(open(f"{w}/{p}.{s}.{r}.json"))["throughput_rps"]
                      for r in range(1, int(rounds) + 1))
print(max(1, int(m * float(f))))' "$work" "$protocol" "$server" "$ROUNDS" "$OPEN_RATE")"
        out="$work/$protocol.$server.open$round.json"
        bench "$protocol" "$server" "$DURATION" "$out" "$rate"
        line "$out" "$protocol" "open$round" "$server"
      done
    done
  done
fi

echo
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$work" "$ROUNDS" "${labels[*]}" "${protocols[*]}" "$OPEN_RATE" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
servers, protocols = sys.argv[3].split(), sys.argv[4].split()
open_rate = float(sys.argv[5])

def load(p, s, r):
    return json.load(open(f"{work}/{p}.{s}.{r}.json"))

def mr(values, fmt):
    values = sorted(values)
    return f"{fmt(statistics.median(values))} ({fmt(values[0])}–{fmt(values[-1])})"

base = servers[0]
# The paired ratios: against the first server, and against the no-op server when it is not first.
refs = [base] + (["noop"] if "noop" in servers and base != "noop" else [])
with_base = any(s.endswith("-base") for s in servers)

def paired(p, s, other):
    return [load(p, s, r)["server_cpu_us"] / max(load(p, other, r)["server_cpu_us"], 1e-9)
            for r in range(1, rounds + 1)]

print("| protocol | server | decisions/s | server CPU µs/decision |%s%s p99 µs | server core share | Redis CPU µs/decision | Redis script µs/call |"
      % ("".join(f" CPU / {r}'s, paired |" for r in refs),
         " CPU / BASE_BIN's, paired |" if with_base else ""))
print("|---|---|---|---|" + "---|" * len(refs) + ("---|" if with_base else "") + "---|---|---|---|")
for p in protocols:
    for s in servers:
        runs = [load(p, s, r) for r in range(1, rounds + 1)]
        against_base = ""
        if with_base:
            # The bare server has no base run: it runs no tollgate code.
            against_base = " %s |" % ("—" if s + "-base" not in servers else
                                      mr(paired(p, s, s + "-base"), lambda v: f"{v:.2f}"))
        redis = [d["redis_cpu_us"] for d in runs if d["redis_cpu_us"] is not None]
        evalsha = [d["redis_evalsha_usec_per_call"] for d in runs
                   if d["redis_evalsha_usec_per_call"] is not None]
        print("| %s | %s | %s | %s |%s%s %s | %s | %s | %s |" % (
            p, s,
            mr([d["throughput_rps"] for d in runs], lambda v: f"{v:.0f}"),
            mr([d["server_cpu_us"] for d in runs], lambda v: f"{v:.1f}"),
            "".join(" %s |" % ("—" if s == r else mr(paired(p, s, r), lambda v: f"{v:.2f}"))
                    for r in refs),
            against_base,
            mr([d["latency_us"]["p99"] for d in runs], lambda v: f"{v:.0f}"),
            mr([d["server_core_share"] for d in runs], lambda v: f"{v:.2f}"),
            mr(redis, lambda v: f"{v:.1f}") if redis else "—",
            mr(evalsha, lambda v: f"{v:.1f}") if evalsha else "—"))
loads = [load(p, s, r)["load_before"] for p in protocols for s in servers for r in range(1, rounds + 1)]
print(f"\nLoad average (1 min) before the closed-loop runs: {mr(loads, lambda v: f'{v:.1f}')}")
errors = sum(load(p, s, r)["errors"] for p in protocols for s in servers for r in range(1, rounds + 1))
if open_rate:
    print(f"\nOpen loop at {open_rate:g} of each server's median closed-loop throughput:\n")
    print("| protocol | server | rate sent /s | decisions/s | p50 µs | p99 µs | p99 < 1 ms in every round | server CPU µs/decision | server core share | generator core share |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in protocols:
        for s in servers:
            runs = [load(p, s, f"open{r}") for r in range(1, rounds + 1)]
            p99 = [d["latency_us"]["p99"] for d in runs]
            closed = statistics.median(load(p, s, r)["throughput_rps"] for r in range(1, rounds + 1))
            print("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |" % (
                p, s, max(1, int(closed * open_rate)),
                mr([d["throughput_rps"] for d in runs], lambda v: f"{v:.0f}"),
                mr([d["latency_us"]["p50"] for d in runs], lambda v: f"{v:.0f}"),
                mr(p99, lambda v: f"{v:.0f}"),
                "yes" if max(p99) < 1000 else "no",
                mr([d["server_cpu_us"] for d in runs], lambda v: f"{v:.1f}"),
                mr([d["server_core_share"] for d in runs], lambda v: f"{v:.2f}"),
                mr([d["generator_core_share"] for d in runs], lambda v: f"{v:.2f}")))
    loads = [load(p, s, f"open{r}")["load_before"] for p in protocols for s in servers
             for r in range(1, rounds + 1)]
    print(f"\nLoad average (1 min) before the open-loop runs: {mr(loads, lambda v: f'{v:.1f}')}")
    errors += sum(load(p, s, f"open{r}")["errors"] for p in protocols for s in servers
                  for r in range(1, rounds + 1))
if errors:
    print(f"\n{errors} requests failed over the rounds: read the figures with care", file=sys.stderr)
PY
