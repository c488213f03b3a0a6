#!/usr/bin/env bash
# Runs every test binary `cargo test --workspace --all-features` built, up to
# $S3DMA_TEST_JOBS (default 3) binaries at a time, then the doctests.
#
# Why not plain `cargo test`: it runs the binaries one after another, and the
# end-to-end suites spend most of their time waiting (a Ceph cluster booting,
# services starting, sockets): the `dpu-agent` suite alone kept 2 cores 29%
# busy for 90 s. Three at a time on the same 2 cores: 80% busy, and the three
# longest suites took 100 s instead of 220 s. The suites are independent:
# every service, Ceph cluster and socket a test starts is on free ports and in
# its own temporary directory.
#
# Each binary runs as cargo would run it (in its package's directory, with
# CARGO_MANIFEST_DIR and CARGO_PKG_NAME set); its output is kept and printed
# whole when it ends, so suites never interleave. Every binary runs even when
# one fails (cargo's --no-fail-fast); the script fails at the end if any did.
# Arguments after the script go to every binary (e.g. `--skip slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${S3DMA_TEST_JOBS:-3}"
CARGO_ALL=(--workspace --all-features --locked)
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

# "WEIGHT|PACKAGE|DIR|TARGET|EXE" lines, heaviest first, so the long suites
# start at once and the short ones fill in around them. The weights are the
# suites' seconds in CI (an unknown binary counts as short); they only order
# the queue.
cargo test "${CARGO_ALL[@]}" --no-run --message-format=json-render-diagnostics |
  python3 .ci/test-binaries.py |
  awk -F'|' '
    BEGIN {
      w["dpu-agent|it"] = 100; w["host-shim|it"] = 70; w["tools|bench"] = 65
      w["storage-target|it"] = 30; w["cli|cli"] = 20; w["fabric|it"] = 8
    }
    { k = $1 "|" $2; print ((k in w) ? w[k] : 1) "|" $3 "|" $4 "|" $2 "|" $5 }' |
  sort -t'|' -k1,1nr >"$LOGS/queue"

total="$(wc -l <"$LOGS/queue")"
if [ "$total" -eq 0 ]; then
  echo "cargo-test-run: no test binaries found" >&2
  exit 1
fi
echo "cargo-test-run: $total test binaries, $JOBS at a time"

# Runs one binary; its log and exit status land in $LOGS/N.log and N.rc.
run_one() {
  local n=$1 pkg=$2 dir=$3 target=$4 exe=$5
  shift 5
  local t0=$SECONDS rc=0
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" "$exe" "$@") \
    >"$LOGS/$n.log" 2>&1 || rc=$?
  printf '%s\n' "$rc" >"$LOGS/$n.rc"
  printf '%s\n' "$((SECONDS - t0))" >"$LOGS/$n.secs"
}

# Prints a finished binary's output whole, once.
report() {
  local n=$1 pkg=$2 target=$3 exe=$4
  echo
  echo "==> $pkg $target ($(basename "$exe")): exit $(cat "$LOGS/$n.rc") after $(cat "$LOGS/$n.secs")s"
  cat "$LOGS/$n.log"
}

n=0 running=0
declare -A ROW=()
while IFS='|' read -r _weight pkg dir target exe; do
  n=$((n + 1))
  ROW[$n]="$pkg|$target|$exe"
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_one "$n" "$pkg" "$dir" "$target" "$exe" "$@" &
  running=$((running + 1))
done <"$LOGS/queue"
wait || true

failed=()
passed=0 tests_failed=0
for i in $(seq 1 "$n"); do
  IFS='|' read -r pkg target exe <<<"${ROW[$i]}"
  report "$i" "$pkg" "$target" "$exe"
  if [ "$(cat "$LOGS/$i.rc")" != 0 ]; then
    failed+=("$pkg $target ($(basename "$exe"))")
  fi
  read -r p f < <(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($(k+1) ~ /^passed/) p += $k
        if ($(k+1) ~ /^failed/) f += $k
      }
    } END { print p + 0, f + 0 }' "$LOGS/$i.log")
  passed=$((passed + p)) tests_failed=$((tests_failed + f))
done

echo
echo "==> doctests"
doc_rc=0
cargo test "${CARGO_ALL[@]}" --doc || doc_rc=$?
if [ "$doc_rc" -ne 0 ]; then
  failed+=("doctests")
fi

echo
echo "cargo-test-run: $n binaries, $passed tests passed, $tests_failed failed (doctests above)"
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'cargo-test-run: FAILED:\n' >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "cargo-test-run: ok"
