#!/usr/bin/env bash
# The layout rules the architecture doc promises, checked against the code:
# the crate map matches cargo metadata, the pure wire crate has no runtime
# or socket dependency, a tenant application's client library builds
# without libibverbs, and fabric's (and wire's) modules form no cycle.
set -euo pipefail
cd "$(dirname "$0")/../.."

python3 tests/structure/crate_map.py

# Normal dependencies only: what an application linking the crate gets.
tree() { cargo tree --locked -e normal --prefix none --format '{p}' -p "$1" | awk '{print $1}' | sort -u; }

for forbidden in tokio mio socket2; do
  if tree s3dma-wire | grep -qx "$forbidden"; then
    echo "s3dma-wire depends on $forbidden: it must stay free of I/O" >&2
    exit 1
  fi
done
echo "s3dma-wire: no tokio, mio or socket2 in its dependency tree"

if tree s3dma-client | grep -qx rdma-sys; then
  echo "s3dma-client depends on rdma-sys: a tenant application would need libibverbs to build" >&2
  cargo tree --locked -e normal -p s3dma-client -i rdma-sys >&2
  exit 1
fi
echo "s3dma-client: no rdma-sys in its dependency tree"

python3 tests/structure/module_cycles.py fabric/src wire/src
