# shellcheck shell=bash
# Environment for cross-building s3dma for aarch64-unknown-linux-gnu.
# Source it: `source images/env-arm64.sh`. Every variable is scoped to the
# aarch64 target (the pkg-config and bindgen crates read <VAR>_<target>
# first), so x86-64 builds in the same shell are unaffected.
#
# rdma-sys's build script finds libibverbs/librdmacm with pkg-config and runs
# bindgen (libclang) on their headers: both must look at the arm64 files.

# pkg-config: only the arm64 multiarch .pc files, cross allowed.
export PKG_CONFIG_ALLOW_CROSS_aarch64_unknown_linux_gnu=1
export PKG_CONFIG_LIBDIR_aarch64_unknown_linux_gnu=/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig
export PKG_CONFIG_PATH_aarch64_unknown_linux_gnu=/usr/lib/aarch64-linux-gnu/pkgconfig
# bindgen passes --target from $TARGET itself; point clang at the arm64
# multiarch headers (libc6-dev:arm64) ahead of the generic /usr/include.
export BINDGEN_EXTRA_CLANG_ARGS_aarch64_unknown_linux_gnu="--target=aarch64-linux-gnu -isystem /usr/include/aarch64-linux-gnu"
# C code built by cc-rs (ring, ...) uses the cross compiler.
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
# A separate target directory keeps arm64 artefacts away from x86-64 ones.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target-arm64}"
