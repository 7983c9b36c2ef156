#!/usr/bin/env bash
# What the instruction counts miss (docs/measuring.md#what-the-counts-miss): the time of one
# clock read (clock_gettime(CLOCK_MONOTONIC), which Instant::now calls, and a bare rdtsc) and
# of one locked atomic add, each from a loop of N (default 10,000,000) timed by itself, pinned
# to one core when taskset exists. Callgrind counts each as about one instruction; on a
# virtual CPU they cost tens of nanoseconds.
#
# Usage: scripts/clock-cost.sh [N]        Needs gcc.
set -euo pipefail
n="${1:-10000000}"
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "clock-cost: N must be a positive integer, not '$n'" >&2; exit 2; }
command -v gcc >/dev/null || { echo "clock-cost: gcc is required" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cat > "$work/cost.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <x86intrin.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    long n = atol(argv[1]);
    volatile uint64_t sink = 0;
    static uint64_t counter;
    struct timespec t;
    double start = now_ns();
    for (long i = 0; i < n; i++) { clock_gettime(CLOCK_MONOTONIC, &t); sink += t.tv_nsec; }
    double clock = (now_ns() - start) / n;
    start = now_ns();
    for (long i = 0; i < n; i++) sink += __rdtsc();
    double tsc = (now_ns() - start) / n;
    start = now_ns();
    for (long i = 0; i < n; i++) __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    double locked = (now_ns() - start) / n;
    start = now_ns();
    for (long i = 0; i < n; i++) sink += i;
    double plain = (now_ns() - start) / n;
    printf("clock_gettime(CLOCK_MONOTONIC)  %6.1f ns\n", clock);
    printf("rdtsc                           %6.1f ns\n", tsc);
    printf("locked add (lock xadd)          %6.1f ns\n", locked);
    printf("the loop alone (a volatile add) %6.1f ns\n", plain);
    return sink == 42 && counter == 0;
}
C
gcc -O2 -o "$work/cost" "$work/cost.c"
pin=()
command -v taskset >/dev/null && pin=(taskset -c "$(($(nproc) - 1))")
echo "$n iterations each, $(date -u +'%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1 /proc/loadavg)"
"${pin[@]}" "$work/cost" "$n"
