#!/usr/bin/env bash
# Installs what a fresh Debian (bookworm) machine lacks to build, run and test
# s3dma. Idempotent: a second run only checks.
#
#   bash .ci/setup.sh          everything (README's first command)
#   bash .ci/setup.sh build    what cargo needs: the build packages and Rust
#   bash .ci/setup.sh tests    the rest: the test tools and the Python .venv
#
# .ci/test.sh runs `build` first and `tests` in the background while clippy
# compiles (they download, cargo computes).
set -euo pipefail
cd "$(dirname "$0")/.."
PART="${1:-all}"
case "$PART" in
  all | build | tests) ;;
  *)
    echo "usage: bash .ci/setup.sh [build|tests]" >&2
    exit 2
    ;;
esac

BUILD_PACKAGES=(
  build-essential pkg-config
  libibverbs-dev librdmacm-dev libclang-dev # rdma-sys (verbs fabric backend)
  protobuf-compiler                         # tonic/prost code generation
  python3                                   # the CI scripts' helpers
  curl ca-certificates
)
TEST_PACKAGES=(
  python3-venv python3-pip                  # boto3 / aws CLI test clients
  rclone s3cmd                              # third-party S3 clients (tests/python)
  iproute2 util-linux procps                # fault tests: netns/veth, tmpfs mounts, ps
  shellcheck                                # the project's shell scripts
  ceph-mon ceph-osd radosgw ceph-common      # an existing S3 cluster for the tests (tests/ceph)
)
APT_PACKAGES=()
[ "$PART" = tests ] || APT_PACKAGES+=("${BUILD_PACKAGES[@]}")
[ "$PART" = build ] || APT_PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "$PART" != tests ]; then
  if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: installing Rust with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
  fi
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi
if [ "$PART" = build ]; then
  echo "setup: build ok"
  exit 0
fi

# Python test clients live in a project-local virtual environment. In CI
# (one throw-away run) pip keeps no second copy of the wheels it installs:
# torch's come to about 3 GB.
if [ -n "${CI:-}" ]; then
  export PIP_NO_CACHE_DIR=1
fi
# Python test clients live in a project-local virtual environment.
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import boto3, pytest, xdist, pytest_timeout, awscli, moto' >/dev/null 2>&1 || [ ! -x .venv/bin/moto_server ] || [ ! -x .venv/bin/hadolint ]; then
  echo "setup: installing Python test clients into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -r tests/requirements.txt
fi
# The Python tenant client (python): its requirements (when the
# venv predates them) and its gRPC stubs (s3dma/_proto, git-ignored).
if ! .venv/bin/python -c 'import grpc, grpc_tools, numpy, google.rpc.status_pb2, s3torchconnector, tenacity' >/dev/null 2>&1; then
  echo "setup: installing the Python tenant client's requirements into .venv"
  .venv/bin/pip install -q -r tests/requirements.txt
fi
.venv/bin/python python/gen_proto.py
# The client itself, as the wheel `pip install ./python` builds
# (stubs generated at build time), with its torch and fsspec extras, so that
# `import s3dma` works in .venv as README shows. torch is PyPI's wheel (about
# 3 GB with its CUDA libraries, under a minute here); pip skips what is
# already installed.
.venv/bin/pip install -q "./python[torch,fsspec]"
echo "setup: ok"
