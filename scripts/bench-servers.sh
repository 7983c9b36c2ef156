# Shared by bench-pinned.sh and bench-ab.sh (sourced, not run): a work directory and the bench
# policy in it, servers started on loopback ports the kernel chooses, and their CPU time.
#
# Sets `work` (removed on exit, with every server started stopped) and `hz`.

work="$(mktemp -d)"
declare -A pid
cleanup() {
  for p in "${pid[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

cat >"$work/policy.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: {name: per_user, unit: second, requests_per_unit: 1000}
YAML

# start NAME BINARY ARGS...: runs BINARY with ARGS on free loopback ports and waits (10 s at
# most) for its listening lines.
start() {
  local name="$1" binary="$2"; shift 2
  RUST_LOG=warn "$binary" "$@" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
    >"$work/$name.out" 2>"$work/$name.err" &
  pid[$name]=$!
  for _ in $(seq 100); do
    grep -q '^grpc listening on ' "$work/$name.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): $name did not start:" >&2
  cat "$work/$name.err" >&2
  exit 2
}

# addr NAME PROTOCOL: where server NAME listens for PROTOCOL (http or grpc).
addr() { sed -n "s/^$2 listening on //p" "$work/$1.out"; }

# ticks NAME: the CPU ticks (user + system) server NAME has used so far, from /proc (Linux).
ticks() { awk '{ print $14 + $15 }' "/proc/${pid[$1]}/stat"; }
hz="$(getconf CLK_TCK)"
