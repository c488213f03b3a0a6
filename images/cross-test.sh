#!/usr/bin/env bash
# Cross-compiles for aarch64-unknown-linux-gnu (the BlueField-3's Arm
# cores) and runs unit tests under qemu-user (the runner in
# .cargo/config.toml: qemu-aarch64-static -L /).
#
# What runs, by default: the unit tests (`--lib --bins`) of the crates the
# DPU runs with code whose behaviour can depend on the architecture: the
# wire formats (byte order, layouts), the fabric (verbs FFI, atomics), the
# shared config and service crates and the generated protobuf code. They are
# built in the release profile (debug assertions and overflow checks on for
# our own crates, and opt-level 1 for them: they are rebuilt for the tests
# anyway, and 3 only cost compile time), so most of their dependencies are
# the ones images/build.sh compiles for the agent's binary (about 50 small
# crates compile again with the tests' features). fabric's tests use
# s3dma-testkit without its `s3` feature: no AWS SDK is built for arm64.
# With WORKSPACE=1: every workspace crate's unit tests instead, in a lean
# dev build (dependencies unoptimised, no debug info), which compiles the
# dev-dependencies too (the AWS SDK, the launcher's harness with
# storage-target: about ten minutes on 2 cores); the agent's, the target's
# and the shim's own logic is architecture-independent Rust that the x86-64
# CI tests natively.
# What is left out, and why:
#   - the tests/ integration suites: the end-to-end suites
#     start storage-target, dpu-agent and host-shim as processes over
#     loopback and move gigabytes; under qemu they take many times their
#     native time, and they test the same Rust code the x86-64 CI runs
#     natively. With FULL=1 (implies WORKSPACE=1) their binaries are built
#     for arm64 (--no-run), which catches an arm64 compile error in them.
#   - doc tests: rustdoc cannot run cross-compiled doc tests on stable.
#   - #[ignore]d tests (verbs hardware, CUDA), as in the native CI.
#
# Usage: images/cross-test.sh   (runs images/setup-arm64.sh first unless
#        SKIP_SETUP=1; WORKSPACE=1 / FULL=1 as above; BUILD_ONLY=1 stops
#        after the cross-build, which CI compiles early at low priority;
#        extra args go to the `cargo test` that runs tests)
set -euo pipefail

IMAGES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TARGET=aarch64-unknown-linux-gnu
cd "$IMAGES/.."
export CARGO_TERM_COLOR=never
step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

if [ "${SKIP_SETUP:-0}" != 1 ]; then
    step "setup"
    "$IMAGES/setup-arm64.sh"
fi
# shellcheck source=images/env-arm64.sh
source "$IMAGES/env-arm64.sh"

if [ "${FULL:-0}" = 1 ]; then
    WORKSPACE=1
fi
if [ "${WORKSPACE:-0}" = 1 ]; then
    # The unit tests exercise logic, not speed: dependencies unoptimised and
    # no debug info halve the cross-build. Under qemu they run in seconds.
    PROFILE=(--workspace --config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.debug=false')
else
    # The agent's crates, in the profile of the agent's release binary.
    # Debug assertions and overflow checks only for our own crates: a
    # profile change for a dependency would compile it twice.
    PROFILE=(--release)
    for crate in s3dma-wire fabric s3dma-config s3dma-service s3dma-proto; do
        PROFILE+=(-p "$crate"
                  --config "profile.release.package.$crate.debug-assertions=true"
                  --config "profile.release.package.$crate.overflow-checks=true"
                  --config "profile.release.package.$crate.opt-level=1")
    done
fi

step "cargo test --lib --bins --target $TARGET --no-run (cross-build: ${PROFILE[*]})"
cargo test --locked --target "$TARGET" --lib --bins --no-run "${PROFILE[@]}"
if [ "${BUILD_ONLY:-0}" = 1 ] && [ "${FULL:-0}" != 1 ]; then
    echo "cross-test.sh: cross-build done in ${SECONDS}s (BUILD_ONLY: nothing run)"
    exit 0
fi

if [ "${FULL:-0}" = 1 ]; then
    step "cargo test --workspace --all-targets --target $TARGET --no-run"
    cargo test --locked --target "$TARGET" --all-targets --no-run "${PROFILE[@]}"
fi

# qemu must load ld.so and libc.so.6 from the same glibc build: with the
# cross sysroot (/usr/aarch64-linux-gnu) as prefix, ld.so came from
# libc6-arm64-cross while libc.so.6 was found in the multiarch
# /lib/aarch64-linux-gnu (libc6:arm64, a newer revision), and that pair
# spins forever in the first pthread_create. The runner therefore uses
# `-L /`. Probe a threaded program first so a broken emulator fails fast
# with a clear message instead of hanging the test run.
step "qemu-user thread probe"
PROBE_DIR="$(mktemp -d)"
trap 'rm -rf "$PROBE_DIR"' EXIT
printf 'fn main() { assert_eq!(std::thread::spawn(|| 7).join().unwrap(), 7); }\n' > "$PROBE_DIR/p.rs"
rustc --target "$TARGET" -C linker=aarch64-linux-gnu-gcc -C target-cpu=cortex-a78 \
    -o "$PROBE_DIR/p" "$PROBE_DIR/p.rs"
if ! timeout 60 qemu-aarch64-static -L / "$PROBE_DIR/p"; then
    echo "cross-test.sh: $(qemu-aarch64-static --version | head -n1) cannot run a" \
         "threaded aarch64 program (is libc6:arm64 installed? images/setup-arm64.sh);" \
         "the cross-build above succeeded." >&2
    exit 2
fi

step "cargo test --lib --bins --target $TARGET (under qemu-aarch64)"
cargo test --locked --target "$TARGET" --lib --bins "${PROFILE[@]}" "$@"

echo "cross-test.sh: done in ${SECONDS}s"
