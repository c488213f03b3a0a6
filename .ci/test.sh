#!/usr/bin/env bash
# The project's test command: the gates CI enforces, then every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh

export CARGO_TERM_COLOR=never
# Each step also prints the free disk space: a full disk fails a build far
# from its cause.
step() {
  printf '\n==> %s (%ss)\n' "$*" "$SECONDS"
  df -h . | awk 'NR == 2 { print "disk: " $4 " free of " $2 }'
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

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy -p fabric --features verbs,cuda,bench --all-targets --locked -- -D warnings
# What a tenant application builds: the client without the verbs backend.
cargo clippy -p s3dma-client -p fabric --all-targets --locked -- -D warnings
cargo clippy -p host-shim --features cuda --all-targets --locked -- -D warnings

step "structure: crate map, dependency trees, module cycles"
bash tests/structure/check.sh

step "cargo doc -D warnings"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked

step "cargo test"
# Builds every binary too: the end-to-end suites (dpu-agent, host-shim,
# s3dma CLI) start storage-target, dpu-agent and host-shim as processes.
cargo test --workspace --locked
# The cuda feature's own tests, here without a driver (they print why they
# skip; the CUDA step below runs them against the stand-in).
cargo test -p fabric --features verbs,cuda --locked

step "python clients (boto3, aws CLI, the s3dma tenant client)"
# The tenant-client tests run the whole stack through `s3dma local`, from the
# binaries `cargo test` built in target/debug.
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pytest -q tests/python

step "cuda: fabric and host-shim CUDA suites against the driver stand-in"
bash .ci/cuda-standin.sh

step "verbs: Soft-RoCE (rxe0) in a VM, every service on verbs"
bash .ci/verbs-tests.sh

step "helm charts: lint, render, validate; rendered configs checked by the binaries"
S3DMA_BIN_DIR="$PWD/target/debug" bash helm/check.sh

step "shellcheck"
shellcheck tests/structure/*.sh tests/ceph/*.sh .ci/run .ci/*.sh images/*.sh helm/check.sh tests/bench/*.sh tests/cuda-standin/*.sh
echo "shellcheck: ok"

step "hadolint"
.venv/bin/hadolint images/Containerfile.dpu-agent
echo "hadolint: ok"

# Nothing below reads the host's debug build (the VM step and helm were its
# last users).
prune target/debug

step "arm64: cross-build, unit tests under qemu-user"
bash images/cross-test.sh
prune target-arm64/aarch64-unknown-linux-gnu/debug target-arm64/debug

step "arm64: the dpu-agent image (buildah, oci-archive, skopeo inspect)"
SKIP_SETUP=1 bash images/build.sh

echo
echo "all tests passed (${SECONDS}s)"
