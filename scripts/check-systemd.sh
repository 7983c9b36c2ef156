#!/usr/bin/env bash
# Checks deploy/systemd/tollgate.service without installing it (CI has no systemd running):
# `systemd-analyze verify` with no warning at all, `systemd-analyze security --offline` under
# an exposure of 1.5, and its ExecStart run briefly as an unprivileged user (in a network
# namespace of its own, for the fixed ports) until /healthz answers.
# Usage: scripts/check-systemd.sh TOLLGATE_BINARY   (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
binary="$(realpath "$1")"
unit=deploy/systemd/tollgate.service
installed=/usr/local/bin/tollgate
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"

# The unit as installed, with its binary at the local build (verify checks that it exists).
sed "s#^ExecStart=$installed #ExecStart=$binary #" "$unit" > "$work/tollgate.service"
grep -q "^ExecStart=$binary " "$work/tollgate.service" || { echo "FAIL: ExecStart is not $installed" >&2; exit 1; }

out="$(systemd-analyze verify "$work/tollgate.service" 2>&1)" || { echo "FAIL: systemd-analyze verify: $out" >&2; exit 1; }
if [ -n "$out" ]; then echo "FAIL: systemd-analyze verify warns: $out" >&2; exit 1; fi
echo "ok: systemd-analyze verify, no warning"

if ! systemd-analyze security --offline=yes --threshold=15 "$work/tollgate.service" > "$work/security.txt" 2>&1; then
  cat "$work/security.txt" >&2
  echo "FAIL: systemd-analyze security: exposure above 1.5" >&2
  exit 1
fi
echo "ok: $(grep -o 'Overall exposure level.*' "$work/security.txt")"

for setting in DynamicUser=yes ProtectSystem=strict NoNewPrivileges=yes CapabilityBoundingSet= ; do
  grep -qx "$setting" "$unit" || { echo "FAIL: $unit lacks $setting" >&2; exit 1; }
done
echo "ok: DynamicUser, ProtectSystem=strict, NoNewPrivileges, no capabilities"

# ExecStart, with the policy it names at the example policy, as nobody.
read -r -a command <<< "$(sed -n "s#^ExecStart=$installed ##p" "$unit")"
policy=/etc/tollgate/policy.yaml
cp examples/policy.yaml "$work/policy.yaml"
chmod 644 "$work/policy.yaml"
args=()
for word in "${command[@]}"; do
  if [ "$word" = "$policy" ]; then args+=("$work/policy.yaml"); else args+=("$word"); fi
done
http_port=""
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = --http-addr ]; then http_port="${args[$((i + 1))]##*:}"; fi
done
[ -n "$http_port" ] || { echo "FAIL: ExecStart has no --http-addr" >&2; exit 1; }
cp "$binary" "$work/tollgate"
chmod 755 "$work/tollgate"
unshare --net -- bash -c '
  set -euo pipefail
  ip link set lo up
  port="$1"; shift
  setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@" 2> "'"$work"'/serve.log" &
  pid=$!
  for _ in $(seq 100); do
    if curl -fsS "http://127.0.0.1:$port/healthz" > /dev/null 2>&1; then
      echo "ok: ExecStart answered /healthz on port $port as uid 65534"
      kill -TERM "$pid"; wait "$pid" || true
      exit 0
    fi
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2> /dev/null || true
  cat "'"$work"'/serve.log" >&2
  echo "FAIL: ExecStart did not answer /healthz" >&2
  exit 1
' check "$http_port" "$work/tollgate" "${args[@]}"
echo "systemd unit: all checks passed"
