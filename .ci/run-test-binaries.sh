#!/usr/bin/env bash
# Runs test binaries JOBS at a time and prints each one's output whole when
# it ends, so suites never interleave; used by .ci/cargo-test-run.sh (the
# host's test run) and .ci/verbs-tests.sh (inside the Soft-RoCE VM).
#
# Usage: run-test-binaries.sh LABEL JOBS LIST [--no-skips] [-- ARGS...]
#   LIST: one "NAME|DIR|EXE|FILTERS" line per binary, in the order to start
#         them (the longest first); FILTERS are libtest arguments (split on
#         spaces, may be empty).
#   --no-skips: a binary that prints SKIPPED fails (the VM, where every
#         suite must run).
#   ARGS: passed to every binary after its FILTERS.
# Each binary runs as cargo runs it: in its package directory, with
# CARGO_MANIFEST_DIR set. Every binary runs even when one fails; the script
# fails at the end if any did, listing them, after a line with the totals.
set -euo pipefail
LABEL=$1 JOBS=$2 LIST=$3
shift 3
NO_SKIPS=0
if [ "${1:-}" = "--no-skips" ]; then
  NO_SKIPS=1
  shift
fi
if [ "${1:-}" = "--" ]; then
  shift
fi
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

# Runs one binary; its log, exit status and seconds land in $LOGS/N.*.
run_one() {
  local n=$1 dir=$2 exe=$3 filters=$4
  shift 4
  local t0=$SECONDS rc=0
  # shellcheck disable=SC2086 # FILTERS are words; empty is no argument
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" $filters "$@") >"$LOGS/$n.log" 2>&1 || rc=$?
  printf '%s\n' "$rc" >"$LOGS/$n.rc"
  printf '%s\n' "$((SECONDS - t0))" >"$LOGS/$n.secs"
}

start=$SECONDS n=0 running=0
declare -A ROW=()
while IFS='|' read -r name dir exe filters; do
  [ -n "$exe" ] || continue
  n=$((n + 1))
  ROW[$n]="$name|$exe|$filters"
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$n" "$dir" "$exe" "$filters" "$@" &
  running=$((running + 1))
done <"$LIST"
wait || true
if [ "$n" -eq 0 ]; then
  echo "$LABEL: no test binaries in $LIST" >&2
  exit 1
fi

failed=() passed=0 tests_failed=0 ignored=0
for i in $(seq 1 "$n"); do
  IFS='|' read -r name exe filters <<<"${ROW[$i]}"
  rc="$(cat "$LOGS/$i.rc")"
  echo
  echo "==> $name ${filters:-(all)} ($(basename "$exe")): exit $rc after $(cat "$LOGS/$i.secs")s"
  cat "$LOGS/$i.log"
  read -r p f ig < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($(k+1) ~ /^passed/) p += $k
        if ($(k+1) ~ /^failed/) f += $k
        if ($(k+1) ~ /^ignored/) i += $k
      }
    } END { print p + 0, f + 0, i + 0 }' "$LOGS/$i.log")
  passed=$((passed + p)) tests_failed=$((tests_failed + f)) ignored=$((ignored + ig))
  if [ "$rc" != 0 ]; then
    failed+=("$name ($(basename "$exe")) exited $rc")
  fi
  if [ "$NO_SKIPS" = 1 ] && grep -q "SKIPPED" "$LOGS/$i.log"; then
    failed+=("$name ($(basename "$exe")) skipped tests")
  fi
done

echo
echo "$LABEL: $n binaries, $JOBS at a time: $passed passed, $tests_failed failed," \
  "$ignored ignored in $((SECONDS - start))s"
if [ "${#failed[@]}" -gt 0 ] || [ "$passed" -eq 0 ]; then
  printf '%s: FAILED:\n' "$LABEL" >&2
  printf '  %s\n' "${failed[@]:-no test passed}" >&2
  exit 1
fi
