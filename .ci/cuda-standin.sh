#!/usr/bin/env bash
# The CUDA path without a GPU: builds the test-only CUDA driver stand-in
# (tests/cuda-standin, into target/cuda-standin; never shipped), then runs
# the `cuda` suites against it with S3DMA_REQUIRE_CUDA=1, so a driver that
# fails to load fails the run instead of skipping the tests:
#   - fabric's `cuda::` tests: device memory, IPC across processes, memory
#     exported and imported as a POSIX fd, the tcp fabric's bounce path into
#     device memory;
#   - the end-to-end `shim::cuda::` tests (s3dma-e2e): a tenant registering device memory by a
#     POSIX fd passed over its lease and GETting into / PUTting from it
#     through host-shim, dpu-agent and storage-target processes, forged fds
#     and legacy IPC handles refused (also another uid's), and, on a shim
#     that allows them, the errors for bad or stale legacy handles;
#   - the Python client's tests/python/test_cuda_client.py: the same through
#     Client.register_cuda_fd / alloc_cuda and `s3dma local`.
# It uses the workspace's one feature set (`--workspace --all-features`, as
# .ci/test.sh), so after `cargo test` there nothing is rebuilt: the `it`
# test binaries and target/debug/{storage-target,dpu-agent,host-shim,s3dma}
# (host-shim with `cuda`) are the ones `cargo test` built. Extra arguments go
# to the test binaries (e.g. --nocapture).
set -euo pipefail
cd "$(dirname "$0")/.."

lib=$(bash tests/cuda-standin/build.sh target/cuda-standin)
echo "CUDA driver stand-in: $lib"

# The stand-in has no dma-buf export, which the verbs fabric needs for
# device memory: the shims under test use the tcp fabric.
export S3DMA_TEST_FABRIC=tcp

run() {
    LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        S3DMA_REQUIRE_CUDA=1 "$@"
}
# `--test it` runs each crate's integration-test binary; only fabric's
# (`cuda::`) and s3dma-e2e's (`shim::cuda::`) have CUDA tests.
run cargo test --workspace --all-features --locked --test it -- cuda:: "$@"
run .venv/bin/python -m pytest -q tests/python/test_cuda_client.py
echo "cuda stand-in suites: ok"
