# Sourced by the pinned benchmark scripts (bench-pinned, bench-redis, bench-hot-key): the
# checks of the settings they share. The sourcing script sets `me` (its name, for errors).

# fail MESSAGE: says what was wrong with a setting and exits 2.
fail() { echo "$me: $*" >&2; exit 2; }

# seconds DURATION: whole seconds of a `5s` / `500ms` / `1m` duration.
seconds() {
  case "$1" in
    *ms) echo $(( (${1%ms} + 999) / 1000 )) ;;
    *s) echo "${1%s}" ;;
    *m) echo $(( ${1%m} * 60 )) ;;
    *) fail "a duration like 5s, 500ms or 1m expected, got '$1'" ;;
  esac
}

# check_rounds_and_durations: ROUNDS 1..20, DURATION 1s..60s and WARMUP (when the script has
# one) at most 60s; sets run_s and warm_s, their whole seconds.
check_rounds_and_durations() {
  [[ "$ROUNDS" =~ ^[0-9]+$ ]] && [ "$ROUNDS" -ge 1 ] && [ "$ROUNDS" -le 20 ] || fail "ROUNDS must be 1..20"
  run_s="$(seconds "$DURATION")"
  warm_s="$(seconds "${WARMUP:-0s}")"
  [[ "$run_s" =~ ^[0-9]+$ ]] && [ "$run_s" -ge 1 ] && [ "$run_s" -le 60 ] || fail "DURATION must be 1s..60s"
  [[ "$warm_s" =~ ^[0-9]+$ ]] && [ "$warm_s" -le 60 ] || fail "WARMUP must be at most 60s"
}
