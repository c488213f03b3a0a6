#!/usr/bin/env bash
# The project's test command: the gates CI enforces, then every test suite.
#
# One feature set for everything (`--workspace --all-features`: verbs, cuda,
# bench and the launcher's harness are additive), so each dependency compiles
# once per profile: clippy and rustdoc share the check build, `cargo test`
# builds the test binaries once, and the CUDA stand-in and Soft-RoCE VM steps
# run those same binaries. Every step's time is printed as it ends and again
# in a table at the end, against the 2,400 s CI budget (printed, not
# enforced).
set -euo pipefail
cd "$(dirname "$0")/.."
# .ci/run exports when it started, so the table counts its set-up too.
RUN_START="${S3DMA_CI_START:-$(date +%s)}"
SETUP_START=$(date +%s)
# What cargo needs, now; the test tools (apt, the Python .venv, LMCache, the
# VM's kernel, the arm64 cross packages) download in the background while
# clippy compiles (see "test tools" below).
bash .ci/setup.sh build
BUDGET_S=2400

export CARGO_TERM_COLOR=never
# The one feature set of every cargo command below.
CARGO_ALL=(--workspace --all-features --locked)

STEP_NAMES=() STEP_SECS=() STEP_BUSY=()
STEP_NAME="" STEP_T0=0 STEP_CPU0=""
# "busy total" jiffies of all CPUs (/proc/stat): a step's busy share says
# whether it fills the cores or waits (the place to overlap work).
cpu_jiffies() {
  awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}
if [ -n "${S3DMA_CI_START:-}" ]; then
  STEP_NAMES+=("set-up (.ci/setup.sh build: apt, rustup)")
  STEP_SECS+=($((SETUP_START - RUN_START))) STEP_BUSY+=("")
fi
STEP_NAMES+=("set-up check") STEP_SECS+=($(($(date +%s) - SETUP_START)))
STEP_BUSY+=("")
end_step() {
  if [ -n "$STEP_NAME" ]; then
    local took=$(($(date +%s) - STEP_T0)) busy0 total0 busy1 total1 busy=""
    read -r busy0 total0 <<<"$STEP_CPU0"
    read -r busy1 total1 < <(cpu_jiffies)
    if [ "$total1" -gt "$total0" ]; then
      busy="$((100 * (busy1 - busy0) / (total1 - total0)))%"
    fi
    STEP_NAMES+=("$STEP_NAME") STEP_SECS+=("$took") STEP_BUSY+=("$busy")
    printf '<== %s: %ss, CPUs %s busy\n' "$STEP_NAME" "$took" "${busy:-?}"
    STEP_NAME=""
  fi
}
# Each step also prints the free disk space: a full disk fails a build far
# from its cause.
step() {
  end_step
  STEP_NAME="$*" STEP_T0=$(date +%s) STEP_CPU0="$(cpu_jiffies)"
  printf '\n==> %s (%ss into the run)\n' "$*" "$((STEP_T0 - RUN_START))"
  df -h . | awk 'NR == 2 { print "disk: " $4 " free of " $2 }'
}
summary() {
  local rc=$?
  end_step
  local total=$(($(date +%s) - RUN_START))
  echo
  echo "step times (s, and how busy the CPUs were):"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%6d %5s  %s\n' "${STEP_SECS[$i]}" "${STEP_BUSY[$i]:-}" "${STEP_NAMES[$i]}"
  done
  printf '%6d        total; CI budget %d s: %s\n' "$total" "$BUDGET_S" \
    "$([ "$total" -le "$BUDGET_S" ] && echo "within" || echo "OVER by $((total - BUDGET_S)) s")"
  if [ "${#FAILED_STEPS[@]}" -gt 0 ]; then
    printf 'test.sh: FAILED steps:\n' >&2
    printf '  %s\n' "${FAILED_STEPS[@]}" >&2
  elif [ "$rc" -ne 0 ]; then
    echo "test.sh: FAILED (exit $rc) in step: ${STEP_NAMES[-1]}" >&2
  fi
}
trap summary EXIT

# A failing command fails its step, not the run: every later step still
# runs, so one run shows every failure (and every step's time); the run
# fails at the end when any step did.
FAILED_STEPS=()
check() {
  if ! "$@"; then
    echo "test.sh: step failed: $STEP_NAME ($*)" >&2
    FAILED_STEPS+=("$STEP_NAME")
  fi
}
# A suite that hangs must fail its step, not eat the run: each test step has a
# deadline of several times its usual length (a hung python step once took a
# whole 5,400 s CI run). timeout signals the whole process group it starts.
check_within() {
  local limit="$1"
  shift
  check timeout -k 30 "$limit" "$@"
}
# In CI (a throw-away clone) build outputs no later step reads are deleted as
# soon as they are done with, so the run fits a small disk.
prune() {
  if [ -n "${CI:-}" ]; then
    rm -rf "$@"
  fi
}
if [ -n "${CI:-}" ]; then
  # A clean build on 2 cores: incremental state and full debug info only cost
  # time there (line tables keep panics' backtraces readable).
  export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only
fi

# The test tools download and unpack (network and disk, little CPU) while
# clippy compiles: the arm64 cross packages and Rust target, the rest of
# .ci/setup.sh (apt test packages, the Python .venv), LMCache, the
# Soft-RoCE VM's kernel and initramfs. One job, in order (apt and pip one at
# a time); the "test tools" step below waits for it and prints its output.
#
# The arm64 packages come first because the arm64 cross-builds (the image's
# agent, then the unit tests of the agent's crates: a release build of
# their own, target-arm64/) start on them, in a job of their own at the
# lowest priority (nice 19): they take only the CPU that clippy's and the
# test build's serial tails and the test suites leave idle, and the arm64
# steps at the end wait for them (at stop 53 the two arm64 steps took 759 s
# at the end of the run, nearly all of it compiling).
TOOLS_LOG="$(mktemp)"
ARM64_LOG="$(mktemp)"
ARM64_RC="$(mktemp -u)"
(
  set -e
  if bash images/setup-arm64.sh; then
    (
      rc=0
      {
        start=$(date +%s)
        BUILD_ONLY=1 SKIP_SETUP=1 nice -n 19 bash images/build.sh &&
          BUILD_ONLY=1 SKIP_SETUP=1 nice -n 19 bash images/cross-test.sh &&
          echo "arm64 cross-builds (nice 19, in the background): $(($(date +%s) - start)) s"
      } >"$ARM64_LOG" 2>&1 || rc=$?
      echo "$rc" >"$ARM64_RC"
    ) &
  else
    echo "images/setup-arm64.sh failed: no arm64 cross-build" >"$ARM64_LOG"
    echo 1 >"$ARM64_RC"
  fi
  bash .ci/setup.sh tests
  bash .ci/setup-lmcache.sh
  bash .ci/rdma-vm.sh --prepare
) >"$TOOLS_LOG" 2>&1 &
TOOLS_PID=$!

step "cargo fmt --check"
check cargo fmt --all -- --check

step "cargo clippy -D warnings (all targets, all features)"
check cargo clippy "${CARGO_ALL[@]}" --all-targets -- -D warnings

step "structure: crate map, dependency trees, module cycles in every crate"
check bash tests/structure/check.sh

step "cargo doc -D warnings"
check env RUSTDOCFLAGS=-Dwarnings cargo doc "${CARGO_ALL[@]}" --no-deps

step "cargo test: build (every test binary and service binary, once)"
# The end-to-end suites (s3dma-e2e: agent, shim, CLI, launcher) start
# storage-target, dpu-agent, host-shim and s3dma as processes from
# target/debug.
check cargo test "${CARGO_ALL[@]}" --no-run
# The service binaries themselves: no service crate has an integration test
# of its own that would make cargo build them (the multi-service suites are
# s3dma-e2e's), so they are built here, from the same dependency builds.
check cargo build "${CARGO_ALL[@]}" --bins

step "test tools: arm64 packages (then the arm64 cross-builds, nice 19, in a job of their own), apt test packages, .venv, lmcache (CPU), the VM's kernel (started in the background before clippy)"
tools_ready() {
  local rc=0
  wait "$TOOLS_PID" || rc=$?
  cat "$TOOLS_LOG"
  rm -f "$TOOLS_LOG"
  return "$rc"
}
check tools_ready

step "cargo test: run, 3 binaries at a time (the cuda tests print why they skip without a driver)"
# The suites mostly wait (Ceph, services starting): three binaries at a time
# fill the cores (.ci/cargo-test-run.sh says how much that saves).
check_within 900 bash .ci/cargo-test-run.sh

step "python clients (boto3, aws CLI, rclone, s3cmd, the s3dma tenant client)"
# The tenant-client tests run the whole stack through `s3dma local`, from the
# binaries `cargo test` built in target/debug. Two workers (pytest-xdist),
# each with its own session server: the clients are CPU-bound Python. A test
# that hangs is ended after 600 s with every thread's stack printed
# (pytest-timeout), and its worker replaced.
check_within 1200 env PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pytest -q -n 2 \
  --timeout 600 --timeout-method thread tests/python

step "cuda: the CUDA suites against the driver stand-in (same binaries)"
check_within 600 bash .ci/cuda-standin.sh

step "verbs: Soft-RoCE (rxe0) in a VM, every service on verbs (same binaries)"
check_within 1500 bash .ci/verbs-tests.sh

step "helm charts: lint, render, validate; rendered configs checked by the binaries"
check env S3DMA_BIN_DIR="$PWD/target/debug" bash helm/check.sh

step "shellcheck, hadolint"
check shellcheck tests/structure/*.sh tests/ceph/*.sh .ci/run .ci/*.sh images/*.sh helm/check.sh tests/bench/*.sh tests/cuda-standin/*.sh
check .venv/bin/hadolint images/Containerfile.dpu-agent


# Nothing below reads the host's debug build (the VM step and helm were its
# last users).
prune target/debug

# One arm64 release build: the image's agent first, then the unit tests of
# the agent's crates in the same profile (most of their dependencies are the
# agent's), both compiled by the background job started before clippy.
step "arm64: waiting for the background cross-builds, then the dpu-agent image (buildah, oci-archive, skopeo inspect)"
arm64_builds() {
  # The job writes its exit status last (also when its set-up failed);
  # the tools job that starts it has ended by now.
  local waited=0
  while [ ! -e "$ARM64_RC" ] && [ "$waited" -lt 3600 ]; do
    sleep 2
    waited=$((waited + 2))
  done
  cat "$ARM64_LOG"
  rm -f "$ARM64_LOG"
  echo "waited ${waited} s for the arm64 cross-builds"
  [ -e "$ARM64_RC" ] && return "$(cat "$ARM64_RC")"
  echo "the arm64 cross-builds did not end within an hour" >&2
  return 1
}
check arm64_builds
check bash images/build.sh

step "arm64: unit tests of the agent's crates under qemu-user (same release build)"
check env SKIP_SETUP=1 bash images/cross-test.sh

end_step
if [ "${#FAILED_STEPS[@]}" -gt 0 ]; then
  exit 1
fi
echo
echo "all tests passed"
