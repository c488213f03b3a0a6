#!/usr/bin/env bash
# The layout rules the architecture doc promises, checked against the code:
# the crate map matches cargo metadata, the pure wire crate has no runtime
# or socket dependency, a tenant application's client library builds
# without libibverbs, and fabric's (and wire's) modules form no cycle.
# Every check runs; the script fails if any did.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit
fail=0

python3 tests/structure/crate_map.py || fail=1

# Normal dependencies only: what an application linking the crate gets.
deps() { cargo tree --locked -e normal --prefix none --format '{p}' -p "$1" | awk '{print $1}' | sort -u; }

wire_deps=$(deps s3dma-wire) || fail=1
bad=$(grep -xE 'tokio|mio|socket2|hyper|tonic' <<<"$wire_deps")
if [ -n "$bad" ]; then
  echo "s3dma-wire depends on $(echo "$bad" | tr '\n' ' '): it must stay free of I/O" >&2
  fail=1
else
  echo "s3dma-wire: no tokio, mio, socket2, hyper or tonic among its $(wc -l <<<"$wire_deps") dependencies"
fi

client_deps=$(deps s3dma-client) || fail=1
if grep -qx rdma-sys <<<"$client_deps"; then
  echo "s3dma-client depends on rdma-sys: a tenant application would need libibverbs to build" >&2
  cargo tree --locked -e normal -p s3dma-client -i rdma-sys >&2
  fail=1
else
  echo "s3dma-client: no rdma-sys among its $(wc -l <<<"$client_deps") dependencies"
fi

python3 tests/structure/module_cycles.py fabric/src wire/src || fail=1
exit "$fail"
