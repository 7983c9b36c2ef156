#!/usr/bin/env bash
# Instructions per decision, counted by `valgrind --tool=callgrind` (repeatable whatever else
# the machine runs; no hardware counters needed): for `Limiter::check` on the memory store per
# algorithm, and for the gRPC and HTTP handlers called in process (no socket), each beside the
# no-op decider's. The harness is crates/tollgate-server/benches/instructions.rs; the method is
# in docs/measuring.md.
#
# Each path runs twice, with N and with 2N decisions after the same setup and warm-up; the
# difference of the two instruction totals divided by N is the instructions per decision, so
# setup, warm-up, runtime start and exit cancel out. That is done REPEAT times (processes
# differ a little: hash seeds are random); the table gives the median and the range.
#
# glibc's malloc is told to cache every freed small block (GLIBC_TUNABLES tcache_count): with
# its default of 7, the heap's layout after the warm-up (which the process's random hash seeds
# shape) decided whether a request's allocations took the slow path, and the HTTP path's count
# moved by 0.7% from one process to the next. With it, counts repeat within about 0.05%.
#
# Usage: scripts/bench-instructions.sh [PATH...]   (default: every path the harness lists)
# Environment: N [5000], a multiple of 1000 (the keys checked in turn); REPEAT [3].
set -euo pipefail
cd "$(dirname "$0")/.."

N="${N:-5000}"
REPEAT="${REPEAT:-3}"
me="$(basename "$0")"
command -v valgrind >/dev/null || { echo "$me: valgrind is required (apt-get install valgrind)" >&2; exit 2; }

echo "building the harness (release)..." >&2
bin="$(cargo bench -p tollgate-server --bench instructions --no-run --message-format=json -j 2 |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "instructions" and m.get("executable"):
        print(m["executable"])')"
[ -x "$bin" ] || { echo "$me: the harness did not build" >&2; exit 2; }

if [ "$#" -gt 0 ]; then paths=("$@"); else mapfile -t paths < <("$bin" list); fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# total PATH DECISIONS: instructions executed by the whole process.
total() {
  local out="$work/callgrind.out"
  GLIBC_TUNABLES=glibc.malloc.tcache_count=65535 valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" "$2" \
    >"$work/stdout" 2>"$work/stderr" || {
    echo "$me: $1 failed:" >&2; tail -20 "$work/stderr" >&2; exit 1; }
  sed -n 's/^summary: *//p' "$out"
}

echo "# $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')  $(rustc --version)  $(valgrind --version)"
echo "# N = $N: instructions per decision = (total at 2N - total at N) / N, median of $REPEAT (range)"
printf '%-32s %14s %14s\n' path instructions/decision range
for path in "${paths[@]}"; do
  for _ in $(seq "$REPEAT"); do
    one="$(total "$path" "$N")"
    two="$(total "$path" $((2 * N)))"
    echo $(( (two - one) / N ))
  done | sort -n | awk -v p="$path" '{ v[NR] = $1 }
    END { printf "%-32s %14d %14s\n", p, v[int((NR + 1) / 2)], v[1] "-" v[NR] }'
done
