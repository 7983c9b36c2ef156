#!/usr/bin/env bash
# A soak: `tollgate serve` on the memory store, one Redis and a 3+3 Redis Cluster in turn (a
# third of DURATION each), loaded by `tollgate bench` with keys rotating every round across a
# rule of every algorithm, while the policy file is rewritten and reloaded and overrides are
# set underneath. Reports RSS over time, Redis keys without a TTL, errors, and the store's key
# count coming back to its floor once the keys expire; exits 1 when one of those fails.
# Usage: scripts/soak.sh [DURATION]   (seconds, `60` or `60s`; default 60)
# Environment: TOLLGATE_BIN (default: builds the debug binary), SOAK_STORES (default
# "memory redis cluster"), SOAK_RATE (requests a second, default 400). See docs/testing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${1:-60}"
duration="${duration%s}"
if ! [[ "$duration" =~ ^[0-9]+$ ]] || [ "$duration" -lt 6 ]; then
  echo "soak: DURATION must be a whole number of seconds, at least 6 (got '${1:-}')" >&2
  exit 2
fi
stores="${SOAK_STORES:-memory redis cluster}"
rate="${SOAK_RATE:-400}"
n_stores=$(wc -w <<<"$stores")
per_store=$((duration / n_stores))
round=3 # seconds of load per key generation

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/tollgate-target}"
if [ -z "${TOLLGATE_BIN:-}" ]; then
  cargo build -p tollgate-cli --bin tollgate --locked --quiet
  TOLLGATE_BIN="$CARGO_TARGET_DIR/debug/tollgate"
fi
for tool in redis-server redis-cli curl python3; do
  command -v "$tool" >/dev/null || { echo "soak: $tool is needed" >&2; exit 2; }
done

work="$(mktemp -d /tmp/tollgate-soak.XXXXXX)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

failures=0
fail() { echo "soak: FAIL: $*" >&2; failures=$((failures + 1)); }

# free_ports N [bus]: N loopback ports nobody listens on now; with `bus`, each also with its
# cluster bus port (the port + 10000) free, so below 55536.
free_ports() {
  python3 - "$1" "${2:-}" <<'EOF'
import random, socket, sys
n, bus = int(sys.argv[1]), sys.argv[2] == "bus"
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return s
    except OSError:
        s.close()
        return None
held, ports = [], []
while len(ports) < n:
    if bus:
        port = random.randint(20000, 55535)
        a, b = free(port), free(port + 10000)
        if a and b:
            held += [a, b]
            ports.append(port)
        else:
            [x.close() for x in (a, b) if x]
    else:
        s = free(0)
        held.append(s)
        ports.append(s.getsockname()[1])
print(" ".join(map(str, ports)))
EOF
}

# wait_for SECONDS COMMAND...: retries COMMAND every 0.1 s until it succeeds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then echo "soak: timed out waiting for: $*" >&2; return 1; fi
    sleep 0.1
  done
}

# start_redis PORT [ARGS...]: a throwaway redis-server in its own directory.
start_redis() {
  local port="$1" dir="$work/redis-$1"
  shift
  mkdir -p "$dir"
  (cd "$dir" && exec redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    "$@" >"$dir/log" 2>&1) &
  pids+=($!)
  wait_for 10 redis-cli -p "$port" ping
}

# policy LIMIT: the policy file, one rule per algorithm, periods of 2 s so keys expire soon.
policy() {
  local limit="$1" burst=$(($1 * 2))
  cat <<EOF
domain: soak
descriptors:
  - key: fw
    rate_limit: {name: fw, algorithm: fixed_window, requests_per_unit: $limit, period: 2s}
  - key: swc
    rate_limit: {name: swc, algorithm: sliding_window_counter, requests_per_unit: $limit, period: 2s}
  - key: swl
    rate_limit: {name: swl, algorithm: sliding_window_log, requests_per_unit: $limit, period: 2s}
  - key: tb
    rate_limit: {name: tb, algorithm: token_bucket, requests_per_unit: $limit, period: 2s, burst: $burst}
  - key: gcra
    rate_limit: {name: gcra, algorithm: gcra, requests_per_unit: $limit, period: 2s, burst: $burst}
  - key: lb
    rate_limit: {name: lb, algorithm: leaky_bucket, requests_per_unit: $limit, period: 2s, burst: $burst}
EOF
}

# counter_keys HTTP_PORT [REDIS_PRIMARY_PORT...]: the store's counters. The memory store's
# from /metrics; on Redis, the keys of the primaries but tollgate's policy state (its
# `{tollgate-policy}` keys: versions, overrides, which stay, with a TTL, for other replicas).
counter_keys() {
  local http="$1" port total=0 n
  shift
  if [ "$#" -eq 0 ]; then store_keys "$http"; return; fi
  for port in "$@"; do
    n=$(redis-cli -p "$port" --scan | grep -cv '{tollgate-policy}' || true)
    total=$((total + n))
  done
  echo "$total"
}

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
store_keys() {
  curl -sf "http://127.0.0.1:$1/metrics" | awk '/^tollgate_store_keys\{/ {print $2}'
}

# no_ttl_keys PORT...: keys without a TTL on these Redis primaries, printed one a line.
no_ttl_keys() {
  local port key
  for port in "$@"; do
    redis-cli -p "$port" --scan | while IFS= read -r key; do
      if [ "$(redis-cli -p "$port" pttl "$key")" = "-1" ]; then printf '%s\n' "$key"; fi
    done
  done
}

# churn ADMIN_PORT POLICY_FILE: until killed, every second rewrites the policy (another limit)
# and reloads it, and sets an override that expires soon; a failure is a line in churn.err.
churn() {
  local admin="$1" file="$2" i=0 code
  while true; do
    i=$((i + 1))
    policy $((5 + i % 4)) >"$file.new" && mv "$file.new" "$file"
    code=$(curl -s -o /dev/null -w "%{http_code}" -X POST -H "Content-Type: application/json" \
      "http://127.0.0.1:$admin/v1/admin/reload")
    [ "$code" = 200 ] || echo "reload answered $code" >>"$work/churn.err"
    code=$(curl -s -o /dev/null -w '%{http_code}' -X PUT -H 'Content-Type: application/json' \
      --data "{\"domain\":\"soak\",\"rule\":\"fw\",\"entries\":[{\"key\":\"fw\",\"value\":\"o$i\"}],\"requests_per_unit\":$((3 + i % 3)),\"period\":\"2s\",\"expires_in\":\"3s\",\"reason\":\"soak\"}" \
      "http://127.0.0.1:$admin/v1/admin/overrides")
    case "$code" in 200 | 201 | 204) ;; *) echo "override answered $code" >>"$work/churn.err" ;; esac
    echo "$i" >"$work/churn.count.new" && mv "$work/churn.count.new" "$work/churn.count"
    sleep 1
  done
}

# soak_store NAME STORE_URL [REDIS_PRIMARY_PORT...]
soak_store() {
  local name="$1" url="$2"
  shift 2
  local primaries=("$@") ports http grpc admin file="$work/policy-$name.yaml"
  read -r http grpc admin <<<"$(free_ports 3)"
  policy 5 >"$file"
  : >"$work/churn.err"
  echo "0" >"$work/churn.count"
  "$TOLLGATE_BIN" serve --config "$file" --store "$url" --http-addr "127.0.0.1:$http" \
    --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" --store-timeout 500ms \
    --sweep-interval 500ms --log-level warn >"$work/serve-$name.log" 2>&1 &
  local server=$!
  pids+=("$server")
  wait_for 20 curl -sf "http://127.0.0.1:$http/readyz"
  local floor rss_start
  floor=$(counter_keys "$http" "${primaries[@]}")
  rss_start=$(rss_kb "$server")
  printf '\n== %s (%s): %s s of load, floor %s keys, RSS %s KiB\n' "$name" "$url" "$per_store" \
    "$floor" "$rss_start"

  churn "$admin" "$file" &
  local churner=$!
  pids+=("$churner")

  local requests=0 errors=0 degraded=0 r=0 started=$SECONDS peak_keys=0 rss_first="" rss
  while [ $((SECONDS - started)) -lt "$per_store" ]; do
    r=$((r + 1))
    local out="$work/bench-$name-$r.json" descriptors=()
    for rule in fw swc swl tb gcra lb; do descriptors+=(--descriptor "$rule=g$r-{key}"); done
    "$TOLLGATE_BIN" bench --target "grpc://127.0.0.1:$grpc" --domain soak "${descriptors[@]}" \
      --keys 500 --rate "$rate" --concurrency 16 --duration "${round}s" --json >"$out" 2>/dev/null ||
      true
    read -r req err deg <<<"$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["requests"], r["errors"], r["degraded_ok"])' "$out" 2>/dev/null || echo "0 1 0")"
    requests=$((requests + req)); errors=$((errors + err)); degraded=$((degraded + deg))
    rss=$(rss_kb "$server")
    [ -n "$rss_first" ] || rss_first=$rss
    local keys
    keys=$(counter_keys "$http" "${primaries[@]}")
    [ "${keys:-0}" -gt "$peak_keys" ] && peak_keys=$keys
    printf '  t=%3ss  round %2s  RSS %6s KiB  keys %6s  requests %6s  errors %s  degraded %s\n' \
      $((SECONDS - started)) "$r" "$rss" "$keys" "$req" "$err" "$deg"
  done
  kill "$churner" 2>/dev/null || true
  wait "$churner" 2>/dev/null || true
  local churns churn_errors
  churns=$(cat "$work/churn.count")
  churn_errors=$(wc -l <"$work/churn.err")

  # Every counter expires: the 2 s periods, an override's 3 s, then the memory sweep.
  local back="" waited=0 keys
  while [ "$waited" -lt 30 ]; do
    keys=$(counter_keys "$http" "${primaries[@]}")
    if [ -n "$keys" ] && [ "$keys" -le "$floor" ]; then back=1; break; fi
    sleep 1
    waited=$((waited + 1))
  done
  local rss_end no_ttl=0
  rss_end=$(rss_kb "$server")
  if [ "${#primaries[@]}" -gt 0 ]; then
    no_ttl_keys "${primaries[@]}" >"$work/no-ttl-$name"
    no_ttl=$(wc -l <"$work/no-ttl-$name")
  fi
  printf '  %s: %s requests, %s errors, %s degraded, %s reloads and overrides (%s failed)\n' \
    "$name" "$requests" "$errors" "$degraded" "$churns" "$churn_errors"
  printf '  %s: RSS start %s KiB, after round 1 %s KiB, end %s KiB; keys floor %s, peak %s, end %s (after %s s); Redis keys without a TTL: %s\n' \
    "$name" "$rss_start" "$rss_first" "$rss_end" "$floor" "$peak_keys" "$keys" "$waited" "$no_ttl"

  [ "$requests" -gt 0 ] || fail "$name: no requests were made"
  [ "$errors" -eq 0 ] || fail "$name: $errors requests failed"
  [ "$degraded" -eq 0 ] || fail "$name: $degraded decisions were taken by the failure posture"
  [ "$churn_errors" -eq 0 ] || fail "$name: $(head -3 "$work/churn.err" | tr '\n' ';')"
  [ -n "$back" ] || fail "$name: the store kept $keys keys, its floor is $floor"
  [ "$no_ttl" -eq 0 ] || fail "$name: keys without a TTL: $(head -3 "$work/no-ttl-$name" | tr '\n' ' ')"
  # Steady state to the end, with a margin for the allocator: a leak grows past it.
  [ "$rss_end" -le $((rss_first * 2 + 32768)) ] ||
    fail "$name: RSS grew from $rss_first KiB to $rss_end KiB"
  kill "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  grep -i 'panic' "$work/serve-$name.log" && fail "$name: the server logged a panic"
  return 0
}

for store in $stores; do
  case "$store" in
    memory) soak_store memory memory ;;
    redis)
      read -r port <<<"$(free_ports 1)"
      start_redis "$port"
      soak_store redis "redis://127.0.0.1:$port" "$port"
      ;;
    cluster)
      read -r -a ports <<<"$(free_ports 6 bus)"
      for port in "${ports[@]}"; do
        start_redis "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
          --cluster-node-timeout 1000
      done
      redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") --cluster-replicas 1 \
        --cluster-yes >"$work/cluster-create.log" 2>&1
      cluster_ok() { redis-cli -p "$1" cluster info | grep -q 'cluster_state:ok'; }
      for port in "${ports[@]}"; do wait_for 30 cluster_ok "$port"; done
      primaries=()
      for port in "${ports[@]}"; do
        [ "$(redis-cli -p "$port" role | head -1)" = master ] && primaries+=("$port")
      done
      [ "${#primaries[@]}" -eq 3 ] || { echo "soak: ${#primaries[@]} primaries, not 3" >&2; exit 1; }
      soak_store cluster "redis+cluster://$(printf '127.0.0.1:%s,' "${ports[@]}" | sed 's/,$//')" \
        "${primaries[@]}"
      ;;
    *) echo "soak: unknown store '$store' (memory, redis, cluster)" >&2; exit 2 ;;
  esac
done

if [ "$failures" -gt 0 ]; then
  echo "soak: $failures invariant(s) failed" >&2
  exit 1
fi
echo "soak: every invariant held"
