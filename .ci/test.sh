#!/usr/bin/env bash
# The project's test command: the gates CI enforces, then every test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh

export CARGO_TERM_COLOR=never
step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo clippy -p fabric --features cuda --all-targets --locked -- -D warnings
cargo clippy -p host-shim --features cuda --all-targets --locked -- -D warnings

step "cargo doc -D warnings"
RUSTDOCFLAGS=-Dwarnings cargo doc --workspace --no-deps --locked

step "cargo test"
# Builds every binary too: the end-to-end suites (dpu-agent, host-shim,
# s3dma CLI) start storage-target, dpu-agent and host-shim as processes.
cargo test --workspace --locked
# The cuda feature's own tests: without a GPU they check the clear
# "no driver" errors; the GPU ones are #[ignore]d (run with --ignored on a GPU host).
cargo test -p fabric --features cuda --locked

step "python clients (boto3, aws CLI, the s3dma tenant client)"
# The tenant-client tests run the whole stack through `s3dma local`.
cargo build --locked --bins
PATH="$PWD/.venv/bin:$PATH" .venv/bin/python -m pytest -q tests/python

echo
echo "all tests passed"
