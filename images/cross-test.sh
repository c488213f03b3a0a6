#!/usr/bin/env bash
# Cross-compiles the s3dma workspace for aarch64-unknown-linux-gnu (the
# BlueField-3's Arm cores) and runs the library unit tests under qemu-user
# (the runner in .cargo/config.toml: qemu-aarch64-static -L /).
#
# What runs: `cargo test --workspace --lib --bins` = every crate's unit tests
# (the #[cfg(test)] modules in src/ of libraries and binaries).
# What is left out, and why:
#   - the tests/ integration suites: the end-to-end suites
#     start storage-target, dpu-agent and host-shim as processes over
#     loopback and move gigabytes; under qemu they take many times their
#     native time, and they test the same Rust code the x86-64 CI runs
#     natively. With FULL=1 their binaries are built for arm64 (--no-run),
#     which catches an arm64 compile error in them but costs a build of the
#     AWS SDK and the other dev-dependencies for arm64 (minutes on 2 cores).
#   - doc tests: rustdoc cannot run cross-compiled doc tests on stable.
#   - #[ignore]d tests (verbs hardware, CUDA), as in the native CI.
#
# Usage: images/cross-test.sh   (runs images/setup-arm64.sh first unless
#        SKIP_SETUP=1; FULL=1 also builds every test target; extra args go to the `cargo test` that runs tests)
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

# The unit tests exercise logic, not speed: dependencies unoptimised and no
# debug info halve the cross-build (the native build optimises dependencies
# because its end-to-end suites move gigabytes). Under qemu they run in
# seconds either way.
LEAN=(--config 'profile.dev.package."*".opt-level=0' --config 'profile.dev.debug=false')

step "cargo test --workspace --lib --bins --target $TARGET --no-run (cross-build)"
cargo test --workspace --locked --target "$TARGET" --lib --bins --no-run "${LEAN[@]}"

if [ "${FULL:-0}" = 1 ]; then
    step "cargo test --workspace --all-targets --target $TARGET --no-run"
    cargo test --workspace --locked --target "$TARGET" --all-targets --no-run "${LEAN[@]}"
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

step "cargo test --workspace --lib --bins --target $TARGET (under qemu-aarch64)"
cargo test --workspace --locked --target "$TARGET" --lib --bins "${LEAN[@]}" "$@"

echo "cross-test.sh: done in ${SECONDS}s"
