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
# .ci/run-test-binaries.sh runs each binary as cargo would (in its package's
# directory, with CARGO_MANIFEST_DIR set) and prints its output whole when it
# ends, so suites never interleave. Every binary runs even when one fails
# (cargo's --no-fail-fast); the script fails at the end if any did.
# Arguments after the script go to every binary (e.g. `--skip slow`).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${S3DMA_TEST_JOBS:-3}"
CARGO_ALL=(--workspace --all-features --locked)
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT

# "NAME|DIR|EXE|FILTERS" lines, heaviest first, so the long suites start at
# once and the short ones fill in around them. The end-to-end binary runs as
# three processes, by top-level module (filters `agent::`, `shim::`, `cli::
# launcher::`), which run side by side as the agent's, the shim's and the
# CLI's binaries did; every other binary runs once, unfiltered. The weights
# are the suites' seconds in CI (an unknown binary counts as short); they
# only order the queue.
cargo test "${CARGO_ALL[@]}" --no-run --message-format=json-render-diagnostics |
  python3 .ci/test-binaries.py |
  awk -F'|' '
    BEGIN {
      w["e2e|it|agent::"] = 100; w["e2e|it|shim::"] = 70; w["tools|it|"] = 65
      w["storage-target|it|"] = 30; w["e2e|it|cli:: launcher::"] = 20; w["fabric|it|"] = 8
      runs["e2e|it"] = "agent::;shim::;cli:: launcher::"
    }
    {
      k = $1 "|" $2
      n = (k in runs) ? split(runs[k], r, ";") : split("", r)
      if (n == 0) { n = 1; r[1] = "" }
      for (i = 1; i <= n; i++) {
        kf = k "|" r[i]
        print ((kf in w) ? w[kf] : 1) "|" $3 " " $2 "|" $4 "|" $5 "|" r[i]
      }
    }' |
  sort -t'|' -k1,1nr | cut -d'|' -f2- >"$LOGS/queue"

rc=0
bash .ci/run-test-binaries.sh cargo-test-run "$JOBS" "$LOGS/queue" -- "$@" || rc=$?

echo
echo "==> doctests"
cargo test "${CARGO_ALL[@]}" --doc || rc=1
if [ "$rc" -ne 0 ]; then
  echo "cargo-test-run: FAILED" >&2
  exit 1
fi
echo "cargo-test-run: ok"
