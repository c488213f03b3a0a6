#!/usr/bin/env bash
# The CUDA path without a GPU: builds the test-only CUDA driver stand-in
# (tests/cuda-standin, into target/cuda-standin; never shipped), then runs
# the `cuda` feature's suites against it with S3DMA_REQUIRE_CUDA=1, so a
# driver that fails to load fails the run instead of skipping the tests:
#   - fabric's tests/cuda.rs: device memory, IPC across processes, memory
#     exported and imported as a POSIX fd, the tcp fabric's bounce path into
#     device memory;
#   - host-shim's tests/it/cuda.rs: a tenant registering device memory by a
#     POSIX fd passed over its lease and GETting into / PUTting from it
#     through host-shim, dpu-agent and storage-target processes, forged fds
#     and legacy IPC handles refused (also another uid's), and, on a shim
#     that allows them, the errors for bad or stale legacy handles;
#   - the Python client's tests/python/test_cuda_client.py: the same through
#     Client.register_cuda_fd / alloc_cuda and `s3dma local`.
# The end-to-end suite starts target/<profile>/{storage-target,dpu-agent,
# host-shim}; the `cargo test -p host-shim --features cuda` below rebuilds
# host-shim there with the feature (a later workspace `cargo test` rebuilds
# it without). Run on a fresh clone after .ci/setup.sh; extra arguments go
# to both test binaries (e.g. --nocapture).
set -euo pipefail
cd "$(dirname "$0")/.."

lib=$(bash tests/cuda-standin/build.sh target/cuda-standin)
echo "CUDA driver stand-in: $lib"

# The stand-in has no dma-buf export, which the verbs fabric needs for
# device memory: the shims under test use the tcp fabric.
export S3DMA_TEST_FABRIC=tcp
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# The other two processes of the end-to-end suite, and `s3dma local` for the Python one.
cargo build --locked -p storage-target -p dpu-agent -p s3dma-cli --bins

run() {
    LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        S3DMA_REQUIRE_CUDA=1 "$@"
}
run cargo test -p fabric --features verbs,cuda --locked --test cuda -- "$@"
run cargo test -p host-shim --features cuda --locked --test it -- cuda:: "$@"
# The Python client's CUDA registration (Client.register_cuda_fd) through
# `s3dma local`, whose host-shim the line above rebuilt with the feature.
cargo build --locked -p host-shim --features cuda --bins
run .venv/bin/python -m pytest -q tests/python/test_cuda_client.py
echo "cuda stand-in suites: ok"
