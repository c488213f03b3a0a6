#!/usr/bin/env bash
# Prepares a Debian bookworm (x86-64) machine to cross-build s3dma for the
# BlueField-3 (aarch64) and to build its OCI image. Idempotent: every step
# checks before it acts, so running it twice costs a few seconds.
#
# Installs: the aarch64 cross gcc/glibc, qemu-user-static (runs the aarch64
# unit tests), buildah + skopeo (image build and inspection), the arm64
# rdma-core development files (rdma-sys links libibverbs/librdmacm and runs
# bindgen on their headers), libclang for bindgen, and the rustup target.
#
# Usage: images/setup-arm64.sh        (as root, or with sudo available)
# Then:  source images/env-arm64.sh   (cross-build environment variables;
#        images/cross-test.sh and images/build.sh source it themselves)
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# 1. arm64 as a foreign dpkg architecture, so `libibverbs-dev:arm64` resolves.
#    The arm64 packages install beside the x86-64 ones (multiarch paths under
#    /usr/lib/aarch64-linux-gnu and /usr/include/aarch64-linux-gnu).
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
    NEED_UPDATE=1
fi

PKGS=(
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross   # cross linker + sysroot
    libc6-dev:arm64                               # multiarch glibc headers for bindgen
    qemu-user-static                              # runs aarch64 test binaries
    buildah skopeo                                # image build / inspect
    libibverbs-dev:arm64 librdmacm-dev:arm64      # rdma-sys links these
    ibverbs-providers:arm64                       # provider libs (mlx5...) for the image rootfs
    libclang-dev clang pkg-config                 # bindgen (rdma-sys build script)
)

missing=()
for p in "${PKGS[@]}"; do
    # dpkg-query prints "install ok installed" for a fully installed package.
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing+=("$p")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "${NEED_UPDATE:-0}" = 1 ] || [ ! -e /var/lib/apt/lists/partial ] \
        || ! compgen -G '/var/lib/apt/lists/*_binary-arm64_Packages*' >/dev/null; then
        $SUDO apt-get update -qq
    fi
    echo "setup-arm64: installing ${missing[*]}"
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "setup-arm64: all packages present"
fi

# 2. The Rust standard library for the target (not with
#    S3DMA_ARM64_PACKAGES_ONLY=1: .ci/test.sh installs the packages in the
#    background while cargo runs, and the target in the arm64 step).
if [ "${S3DMA_ARM64_PACKAGES_ONLY:-0}" = 1 ]; then
    echo "setup-arm64: packages ready (the rustup target: later)"
    exit 0
fi
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi

# 3. Sanity: the cross linker, qemu and the arm64 .pc files are where
#    .cargo/config.toml and images/env-arm64.sh expect them.
command -v aarch64-linux-gnu-gcc >/dev/null
command -v qemu-aarch64-static >/dev/null
test -f /usr/lib/aarch64-linux-gnu/pkgconfig/libibverbs.pc
test -f /usr/lib/aarch64-linux-gnu/pkgconfig/librdmacm.pc
echo "setup-arm64: ready (source images/env-arm64.sh before cargo --target aarch64-unknown-linux-gnu)"
