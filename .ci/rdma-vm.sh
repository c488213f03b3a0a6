#!/usr/bin/env bash
# Runs a command inside a small VM with real RDMA devices: Soft-RoCE
# (rdma_rxe) on the guest's dummy0, named rxe0 (10.77.0.1), and on dummy1,
# named rxe1 (10.77.1.1).
#
#   bash .ci/rdma-vm.sh CMD [ARG...]
#   bash .ci/rdma-vm.sh --prepare     (host tools, kernel, initramfs; no boot)
#
# This machine's kernel has no RDMA, so the guest boots Debian's own kernel
# (linux-image-amd64's image, fetched with `apt-get download`, unpacked with
# `dpkg -x`) under qemu with TCG (KVM here only runs kernels built for it).
# There is no disk image: the guest mounts the host's `/` read-only over
# virtio-9p with a tmpfs overlay on top, so the host's glibc, libibverbs,
# librxe, toolchain and already-built test binaries run unchanged inside it.
# A busybox initramfs with the needed modules gets it there.
#
# Inside, CMD runs in the project root (same path as here) with the caller's
# PATH, HOME, CARGO_*/RUST*/S3DMA_* and CI variables, plus
# S3DMA_RDMA_VM=1 (tests that need an RDMA device treat a missing one as a
# failure there) and CARGO_NET_OFFLINE=true (the guest has no network). Its
# output goes to this script's stdout and its exit status is the script's.
#
# Kernel, modules and initramfs are cached under target/rdma-vm (ignored);
# the first run downloads ~70 MB. Environment:
#   S3DMA_VM_MEM      guest memory in MiB (default 8192: the suites hold
#                     several GiB of registered memory at once)
#   S3DMA_VM_CPUS     guest vCPUs (default: the host's, at most 4)
#   S3DMA_VM_TIMEOUT  seconds before the VM is killed (default 3600)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${S3DMA_VM_CACHE:-$ROOT/target/rdma-vm}"
MEM="${S3DMA_VM_MEM:-8192}"
CPUS="${S3DMA_VM_CPUS:-$(nproc)}"
[ "$CPUS" -le 4 ] || CPUS=4
TIMEOUT="${S3DMA_VM_TIMEOUT:-3600}"

if [ $# -eq 0 ]; then
  echo "usage: bash .ci/rdma-vm.sh CMD [ARG...]   (or --prepare: install and fetch, no boot)" >&2
  exit 2
fi

log() { printf 'rdma-vm: %s\n' "$*" >&2; }

# --- host tools -------------------------------------------------------------
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx modprobe || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
command -v ibv_devices >/dev/null || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null || need+=(perftest)
command -v rdma >/dev/null || need+=(iproute2)
dpkg-query -W -f='${Status}' ibverbs-providers 2>/dev/null | grep -q "ok installed" || need+=(ibverbs-providers)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- guest kernel and modules (cached) ---------------------------------------
mkdir -p "$CACHE"
KPKG="$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
if [ -z "$KPKG" ]; then
  # An apt cache without package lists (a fresh container): fetch them once.
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  KPKG="$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')"
fi
KVER="${KPKG#linux-image-}"
KROOT="$CACHE/kernel-$KVER"
if [ ! -f "$KROOT/.done" ]; then
  log "fetching $KPKG"
  rm -rf "$KROOT" "$CACHE"/dl
  mkdir -p "$CACHE/dl" "$KROOT"
  # apt's sandbox user cannot write into a root-owned folder: not a failure.
  (
    cd "$CACHE/dl"
    apt-get download "$KPKG" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
  )
  deb="$(ls "$CACHE"/dl/"$KPKG"_*.deb)"
  dpkg -x "$deb" "$KROOT"
  rm -rf "$CACHE/dl"
  touch "$KROOT/.done"
fi
KMOD="$KROOT/lib/modules/$KVER"
VMLINUZ="$KROOT/boot/vmlinuz-$KVER"

# The modules the guest loads, in the order it loads them (modprobe pulls in
# what modules.dep lists). crc32_generic is needed by rdma_rxe but not listed
# in modules.dep: without it `rdma link add` fails with "failed to init
# crc32 algorithm".
MODULES=(virtio_pci 9pnet_virtio 9p overlay dummy crc32_generic rdma_rxe)

INITRD="$CACHE/initramfs-$KVER.cpio.gz"
SCRIPT_SUM="$(sha256sum "$0" | cut -c1-16)"
if [ ! -f "$INITRD" ] || [ "$(cat "$INITRD.sum" 2>/dev/null)" != "$SCRIPT_SUM" ]; then
  log "building the initramfs"
  [ -f "$KMOD/modules.dep" ] || depmod -b "$KROOT" "$KVER"
  IR="$CACHE/initramfs"
  rm -rf "$IR"
  mkdir -p "$IR"/{bin,dev,proc,sys,mnt/lower,mnt/rw,mnt/xfer,newroot,lib/modules/"$KVER"}
  cp /bin/busybox "$IR/bin/busybox"
  for a in sh mount umount mkdir insmod modprobe poweroff sleep cat echo chroot ln; do
    ln -s busybox "$IR/bin/$a"
  done
  # Each module and everything modules.dep says it needs, at the same paths.
  declare -A seen=()
  add_module() {
    local name="$1" line path dep
    line="$(grep -E "(^|/)${name}\.ko(\.[a-z]+)?:" "$KMOD/modules.dep" | head -1)"
    if [ -z "$line" ]; then
      grep -qE "/${name}\.ko" "$KMOD/modules.builtin" && return 0
      echo "rdma-vm: module $name not found in $KPKG" >&2
      exit 1
    fi
    path="${line%%:*}"
    [ -n "${seen[$path]:-}" ] && return 0
    seen[$path]=1
    mkdir -p "$IR/lib/modules/$KVER/$(dirname "$path")"
    cp "$KMOD/$path" "$IR/lib/modules/$KVER/$path"
    for dep in ${line#*:}; do
      dep="$(basename "$dep")"
      add_module "${dep%%.ko*}"
    done
  }
  for m in "${MODULES[@]}"; do add_module "$m"; done
  cp "$KMOD"/modules.builtin* "$KMOD/modules.order" "$IR/lib/modules/$KVER/"
  depmod -b "$IR" "$KVER"
  cat >"$IR/init" <<EOF
#!/bin/sh
# Guest init: modules, the host's / (read-only 9p) under a tmpfs overlay,
# then the project's command in a chroot of it.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in ${MODULES[*]}; do
  modprobe \$m || { echo "rdma-vm: modprobe \$m failed"; poweroff -f; }
done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /mnt/lower || poweroff -f
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 xfer /mnt/xfer || poweroff -f
mount -t tmpfs -o size=75% rw /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
# Writes anywhere (/tmp included: no tmpfs over it, the project may live
# there) land in the tmpfs upper layer and vanish with the VM.
mount -t overlay overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work /newroot || poweroff -f
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs run /newroot/run
mkdir -p /newroot/mnt/xfer /newroot/dev/shm /newroot/dev/pts
mount -t tmpfs shm /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
ln -sf /proc/self/fd /newroot/dev/fd
ln -sf /proc/self/fd/0 /newroot/dev/stdin
ln -sf /proc/self/fd/1 /newroot/dev/stdout
ln -sf /proc/self/fd/2 /newroot/dev/stderr
mount --bind /mnt/xfer /newroot/mnt/xfer
chroot /newroot /bin/bash /mnt/xfer/guest.sh
poweroff -f
EOF
  chmod +x "$IR/init"
  (cd "$IR" && find . | cpio -o -H newc --quiet | gzip -1) >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  echo "$SCRIPT_SUM" >"$INITRD.sum"
  rm -rf "$IR"
fi
if [ "$1" = --prepare ]; then
  # Host tools, kernel and initramfs in place; no boot (.ci/test.sh does
  # this in the background while cargo builds).
  log "prepared (kernel $KVER)"
  exit 0
fi

# --- the command -------------------------------------------------------------
XFER="$(mktemp -d "$CACHE/xfer.XXXXXX")"
trap 'rm -rf "$XFER"' EXIT
{
  echo '#!/bin/bash'
  echo '# Written by .ci/rdma-vm.sh: bring up rxe0, then run the command.'
  echo 'set -u'
  echo 'exec </dev/null'
  echo 'export LANG=C.UTF-8 TERM=dumb S3DMA_RDMA_VM=1 CARGO_NET_OFFLINE=true'
  while IFS='=' read -r name _; do
    case "$name" in
      PATH | HOME | USER | CI | CARGO_* | RUST* | S3DMA_*) printf 'export %s=%q\n' "$name" "${!name}" ;;
    esac
  done < <(env)
  cat <<'EOF'
echo 1 > /proc/sys/net/ipv4/ip_forward 2>/dev/null
ip link set lo up
# rxe over dummy0 with an IPv4 address (the RoCE v2 GID at index 1); MTU 9000
# gives an active MTU of 4096. Processes in the guest reach each other through
# rxe0 at that address.
ip link set dummy0 mtu 9000
ip addr add 10.77.0.1/24 dev dummy0
ip link set dummy0 up
if ! rdma link add rxe0 type rxe netdev dummy0; then
  echo "rdma-vm: rdma link add failed"
  echo 1 > /mnt/xfer/rc
  exit 1
fi
# A second device, rxe1 on dummy1 (10.77.1.1): the verbs rails tests use
# rxe0 and rxe1 as two rails, and cut one by taking dummy1 down.
ip link add dummy1 type dummy
ip link set dummy1 mtu 9000
ip addr add 10.77.1.1/24 dev dummy1
ip link set dummy1 up
if ! rdma link add rxe1 type rxe netdev dummy1; then
  echo "rdma-vm: rdma link add rxe1 failed"
  echo 1 > /mnt/xfer/rc
  exit 1
fi
echo "rdma-vm: guest $(uname -r), $(nproc) vCPUs, $(awk '/MemTotal/ {print int($2/1024) " MiB"}' /proc/meminfo)"
rdma link show
for d in rxe0 rxe1; do ibv_devinfo -d $d | grep -E 'hca_id|state|active_mtu|link_layer' | sed 's/^/rdma-vm: /'; done
EOF
  printf 'cd %q || exit 1\n' "$ROOT"
  printf 'echo "rdma-vm: running:%s"\n' "$(printf ' %q' "$@" | sed 's/"/\\"/g')"
  printf '%q ' "$@"
  echo
  echo 'echo $? > /mnt/xfer/rc'
} >"$XFER/guest.sh"

log "booting $KVER (TCG, $CPUS vCPUs, $MEM MiB)"
start=$SECONDS
set +e
timeout --foreground -k 10 "$TIMEOUT" qemu-system-x86_64 \
  -machine q35 -accel tcg,thread=multi -cpu max -smp "$CPUS" -m "$MEM" \
  -kernel "$VMLINUZ" -initrd "$INITRD" \
  -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init" \
  -display none -monitor none -serial stdio -no-reboot -nic none \
  -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
  -virtfs local,path="$XFER",mount_tag=xfer,security_model=none \
  </dev/null
qrc=$?
set -e
if [ ! -f "$XFER/rc" ]; then
  log "the guest did not report an exit status (qemu exit $qrc after $((SECONDS - start))s)"
  exit 1
fi
rc="$(cat "$XFER/rc")"
log "guest command exited $rc after $((SECONDS - start))s in the VM"
exit "$rc"
