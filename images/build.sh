#!/usr/bin/env bash
# Builds everything for a BlueField-3 deployment of s3dma into images/out:
#   dpu-agent-arm64.oci.tar   the arm64 dpu-agent image (FROM scratch), an
#                             oci-archive for `ctr -n k8s.io images import`
#   rootfs/                   the image's contents (build context)
#   agent.yaml                the DPU agent config (from the example, secret
#                             paths under /etc/s3dma/secrets, listening on
#                             0.0.0.0), checked with `dpu-agent --check`
#   dpu-agent.yaml            the kubelet static-pod manifest, with this image
#   bf.cfg                    bf.cfg with bfb_modify_os and the payload
# and ends with `skopeo inspect` of the archive (Architecture: arm64).
#
# Usage: images/build.sh            (runs images/setup-arm64.sh first)
# Env:   AGENT_CONFIG=path          agent config to ship (default: rendered
#                                   from dpu-agent/dpu-agent.example.yaml)
#        IMAGE_NAME=docker.io/s3dma/dpu-agent   IMAGE_TAG=<workspace version>
#        PROVIDERS="mlx5 rxe"       rdma-core provider plugins in the image
#        SKIP_SETUP=1               do not run setup-arm64.sh
#        BUILD_ONLY=1               stop after the agent's cross-build (CI
#                                   compiles it early, at low priority)
set -euo pipefail

IMAGES="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$IMAGES/.." && pwd)"
OUT="$IMAGES/out"
TARGET=aarch64-unknown-linux-gnu
MULTIARCH=/usr/lib/aarch64-linux-gnu
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
IMAGE_NAME="${IMAGE_NAME:-docker.io/s3dma/dpu-agent}"
IMAGE_TAG="${IMAGE_TAG:-$VERSION}"
IMAGE_REF="$IMAGE_NAME:$IMAGE_TAG"
PROVIDERS="${PROVIDERS:-mlx5 rxe}"
ARCHIVE="$OUT/dpu-agent-arm64.oci.tar"
step() { printf '\n== %s (%ss)\n' "$*" "$SECONDS"; }

# 1. Toolchain, cross libraries, buildah/skopeo (idempotent).
if [ "${SKIP_SETUP:-0}" != 1 ]; then
    step "setup"
    "$IMAGES/setup-arm64.sh"
fi
# shellcheck source=images/env-arm64.sh
source "$IMAGES/env-arm64.sh"

# 2. The release agent for the Cortex-A78 (.cargo/config.toml's rustflags).
step "cargo build --release -p dpu-agent --target $TARGET"
cd "$ROOT"
cargo build --release --locked -p dpu-agent --bin dpu-agent --target "$TARGET"
BIN="$CARGO_TARGET_DIR/$TARGET/release/dpu-agent"
if [ "${BUILD_ONLY:-0}" = 1 ]; then
    echo "build.sh: cross-build done in ${SECONDS}s (BUILD_ONLY: no image)"
    exit 0
fi

# 3. The rootfs: the binary, every shared library it needs (NEEDED, followed
#    recursively, from Debian's arm64 packages), the rdma-core providers it
#    dlopens, passwd/group for uid 65532, nothing else (no shell).
step "assembling the rootfs"
ROOTFS="$OUT/rootfs"
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS/usr/bin" "$ROOTFS$MULTIARCH/libibverbs" "$ROOTFS/etc/libibverbs.d" \
         "$ROOTFS/etc/s3dma/secrets" "$ROOTFS/tmp"
chmod 1777 "$ROOTFS/tmp"
# Line tables stay out of the image (keep the unstripped binary for
# symbolising); the symbol table stays for backtraces.
aarch64-linux-gnu-strip --strip-debug -o "$ROOTFS/usr/bin/dpu-agent" "$BIN"
# Merged /usr as on Debian: /lib -> usr/lib; the ELF interpreter
# /lib/ld-linux-aarch64.so.1 -> aarch64-linux-gnu/ld-linux-aarch64.so.1.
ln -s usr/lib "$ROOTFS/lib"
ln -s aarch64-linux-gnu/ld-linux-aarch64.so.1 "$ROOTFS/usr/lib/ld-linux-aarch64.so.1"
cp -L "$MULTIARCH/ld-linux-aarch64.so.1" "$ROOTFS$MULTIARCH/"

needed() { aarch64-linux-gnu-readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
declare -A SEEN=()
copy_deps() {
    local lib
    for lib in $(needed "$1"); do
        [ -n "${SEEN[$lib]:-}" ] && continue
        SEEN[$lib]=1
        [ -e "$MULTIARCH/$lib" ] || { echo "build.sh: $lib (needed by $1) not in $MULTIARCH" >&2; exit 1; }
        cp -L "$MULTIARCH/$lib" "$ROOTFS$MULTIARCH/$lib"
        copy_deps "$MULTIARCH/$lib"
    done
}
copy_deps "$BIN"
for p in $PROVIDERS; do
    cp -L "$MULTIARCH/libibverbs/lib$p-rdmav34.so" "$ROOTFS$MULTIARCH/libibverbs/"
    cp "/etc/libibverbs.d/$p.driver" "$ROOTFS/etc/libibverbs.d/"
    copy_deps "$MULTIARCH/libibverbs/lib$p-rdmav34.so"
done
cat > "$ROOTFS/etc/passwd" <<'PW'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
PW
cat > "$ROOTFS/etc/group" <<'GR'
root:x:0:
nonroot:x:65532:
GR
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$ROOTFS/etc/nsswitch.conf"
chmod 0755 "$ROOTFS/etc/s3dma"
chmod 0700 "$ROOTFS/etc/s3dma/secrets"
# Everything root-owned; the mounted secrets dir replaces this empty one.
echo "rootfs: $(du -sh "$ROOTFS" | cut -f1); libraries: $(cd "$ROOTFS$MULTIARCH" && find . -name '*.so*' | sort | tr '\n' ' ')"

# 4. The DPU agent config, and a smoke test of the rootfs: the agent starts
#    under qemu with only the rootfs's libraries (-L) and checks the config
#    against throwaway secrets.
step "agent config, checked by the arm64 agent in the rootfs"
if [ -n "${AGENT_CONFIG:-}" ]; then
    cp "$AGENT_CONFIG" "$OUT/agent.yaml"
else
    sed -e 's|address: 127.0.0.1:7000|address: 0.0.0.0:7000|' \
        -e 's|address: 127.0.0.1:9102|address: 0.0.0.0:9102|' \
        -e 's|/etc/s3dma/shims/|/etc/s3dma/secrets/shims/|' \
        -e 's|/etc/s3dma/tenants/|/etc/s3dma/secrets/tenants/|' \
        -e 's|/etc/s3dma/fabric.key|/etc/s3dma/secrets/fabric.key|' \
        -e 's|/etc/s3dma/agent.key|/etc/s3dma/secrets/agent.key|' \
        -e 's|^# Run: dpu-agent --config .*|# Run: dpu-agent --config /etc/s3dma/agent.yaml (DPU image; rendered by images/build.sh)|' \
        "$ROOT/dpu-agent/dpu-agent.example.yaml" > "$OUT/agent.yaml"
fi
CHECK="$OUT/check"
rm -rf "$CHECK"; mkdir -p "$CHECK"
while read -r f; do
    mkdir -p "$CHECK$(dirname "$f")"
    case "$f" in
        *.key) printf '%064x\n' 7 > "$CHECK$f" ;;
        *) echo "check-only-secret-0123456789abcdef" > "$CHECK$f" ;;
    esac
    chmod 600 "$CHECK$f"  # the agent refuses secret files others can read
done < <(grep -oE '/etc/s3dma/secrets/[^ "]+' "$OUT/agent.yaml" | sort -u)
sed "s|/etc/s3dma/secrets/|$CHECK/etc/s3dma/secrets/|g" "$OUT/agent.yaml" > "$CHECK/agent.yaml"
# (timeout: bookworm's qemu 7.2 can hang in thread spawn, see cross-test.sh)
timeout 120 qemu-aarch64-static -L "$ROOTFS" "$ROOTFS/usr/bin/dpu-agent" --config "$CHECK/agent.yaml" --check
rm -rf "$CHECK"

# 5. The image: FROM scratch + the rootfs, for linux/arm64. COPY needs no
#    emulation; vfs storage and chroot isolation need no kernel overlay or
#    user namespaces. A private storage root keeps the host's untouched.
step "buildah build $IMAGE_REF"
STORE=(--root "$OUT/storage" --runroot "$OUT/runroot" --storage-driver vfs)
EPOCH="$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)"
buildah "${STORE[@]}" build --isolation chroot --arch arm64 --os linux \
    --timestamp "$EPOCH" --build-arg VERSION="$VERSION" \
    -f "$IMAGES/Containerfile.dpu-agent" -t "$IMAGE_REF" "$ROOTFS"
rm -f "$ARCHIVE"
buildah "${STORE[@]}" push "$IMAGE_REF" "oci-archive:$ARCHIVE:$IMAGE_REF"
buildah "${STORE[@]}" rmi "$IMAGE_REF" >/dev/null
echo "image: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1))"

# 6. The static pod with this image, and bf.cfg with its payload.
step "rendering dpu-agent.yaml and bf.cfg"
sed -E "s|image: docker.io/s3dma/dpu-agent:[^ ]*|image: $IMAGE_REF|" \
    "$IMAGES/static-pod/dpu-agent.yaml" > "$OUT/dpu-agent.yaml"
grep -q "image: $IMAGE_REF" "$OUT/dpu-agent.yaml"
{
    cat "$IMAGES/bfb/bf.cfg"
    printf '\n# ---- payload rendered by images/build.sh (%s) ----\n' "$IMAGE_REF"
    for pair in "s3dma_payload_agent_config:$OUT/agent.yaml" \
                "s3dma_payload_static_pod:$OUT/dpu-agent.yaml" \
                "s3dma_payload_image:$ARCHIVE"; do
        printf '%s()\n{\n    cat <<'"'"'S3DMA_PAYLOAD'"'"'\n' "${pair%%:*}"
        base64 -w 76 "${pair#*:}"
        printf 'S3DMA_PAYLOAD\n}\n\n'
    done
} > "$OUT/bf.cfg"
bash -n "$OUT/bf.cfg"
echo "bf.cfg: $OUT/bf.cfg ($(du -h "$OUT/bf.cfg" | cut -f1))"

# 7. Proof of the architecture.
step "skopeo inspect oci-archive:$ARCHIVE"
skopeo inspect "oci-archive:$ARCHIVE"
skopeo inspect "oci-archive:$ARCHIVE" | grep -q '"Architecture": "arm64"'
echo "build.sh: done in ${SECONDS}s"
