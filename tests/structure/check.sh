#!/usr/bin/env bash
# The layout rules the architecture doc promises, checked against the code:
# the crate map matches cargo metadata, the pure wire crate has no runtime
# or socket dependency, what a tenant builds (the client library and the
# `s3dma` CLI) needs no libibverbs, and no crate's modules import each other
# in a circle; the tenant CLI links no service and stays small; a service's
# tests build without the other services (its dev-dependencies name none,
# nor the launcher: tests that need several services live in e2e/); only
# the dialect modules (and config parsing and validation) match on the
# dialect enums; only fabric and s3dma-ring leave the workspace lints
# (the only crates allowed unsafe code).
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

# What a tenant machine builds: the client library and the `s3dma` CLI
# (local mode starts the services' binaries; it uses only their config
# types, without their `verbs` feature).
for tenant_crate in s3dma-client s3dma-cli; do
  tenant_deps=$(deps "$tenant_crate") || fail=1
  if grep -qx rdma-sys <<<"$tenant_deps"; then
    echo "$tenant_crate depends on rdma-sys: a tenant machine would need libibverbs to build it" >&2
    cargo tree --locked -e normal -p "$tenant_crate" -i rdma-sys >&2
    fail=1
  else
    echo "$tenant_crate: no rdma-sys among its $(wc -l <<<"$tenant_deps") dependencies"
  fi
done

# The tenant CLI: no service crate and not the launcher in its normal
# dependency tree (`s3dma local` runs the launcher's `s3dma-local` binary),
# and at most CLI_MAX_CRATES unique crate names.
CLI_MAX_CRATES=150
services_re='storage-target|dpu-agent|host-shim|s3dma-launcher'
cli_deps=$(deps s3dma-cli) || fail=1
bad=$(grep -xE "$services_re" <<<"$cli_deps")
if [ -n "$bad" ]; then
  echo "s3dma-cli depends on $(echo "$bad" | tr '\n' ' '): the tenant CLI must link no service (nor the launcher)" >&2
  fail=1
fi
cli_count=$(wc -l <<<"$cli_deps")
if [ "$cli_count" -gt "$CLI_MAX_CRATES" ]; then
  echo "s3dma-cli pulls $cli_count crates (unique names in its normal dependency tree): at most $CLI_MAX_CRATES" >&2
  fail=1
elif [ -z "$bad" ]; then
  echo "s3dma-cli: no service crate, $cli_count crates (at most $CLI_MAX_CRATES)"
fi

# A service's tests build without the other services: its normal and dev
# dependency trees name no other service and not the launcher.
for service in storage-target dpu-agent host-shim; do
  tree=$(cargo tree --locked -e normal,dev --prefix none --format '{p}' -p "$service" | awk '{print $1}' | sort -u) || fail=1
  bad=$(grep -xE "$services_re" <<<"$tree" | grep -vx "$service")
  if [ -n "$bad" ]; then
    echo "$service's dependencies (with dev-dependencies) include $(echo "$bad" | tr '\n' ' '): a service's tests use s3dma-testkit; tests that need several services go to e2e/" >&2
    for b in $bad; do
      cargo tree --locked -e normal,dev -p "$service" -i "$b" 2>&1 | head -20 >&2
    done
    fail=1
  else
    echo "$service: no other service and no launcher among its dependencies and dev-dependencies"
  fi
done

# Only dialect/ modules (and config parsing and validation) match on the
# dialect enums.
python3 tests/structure/dialect_matches.py || fail=1

# Every crate of the workspace: the directory of each member's Cargo.toml.
mapfile -t crate_srcs < <(cargo metadata --locked --no-deps --format-version 1 |
  python3 -c 'import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    print(os.path.join(os.path.relpath(os.path.dirname(p["manifest_path"])), "src"))')
python3 tests/structure/module_cycles.py "${crate_srcs[@]}" || fail=1

# Unsafe code only in fabric and s3dma-ring: every other member inherits
# the workspace lints (`unsafe_code = "forbid"`), which those two replace
# with their own table (`unsafe_op_in_unsafe_fn`, SAFETY comments).
UNSAFE_ALLOWED='fabric|ring'
own_lints=$(for src in "${crate_srcs[@]}"; do
  dir=${src%/src}
  awk '/^\[lints\]/{f=1;next} /^\[/{f=0} f && /workspace *= *true/{ok=1} END{exit !ok}' \
    "$dir/Cargo.toml" || echo "$dir"
done)
bad=$(grep -vxE "$UNSAFE_ALLOWED" <<<"$own_lints" | grep -v '^$')
if [ -n "$bad" ]; then
  echo "$(echo "$bad" | tr '\n' ' ')do not inherit the workspace lints (unsafe_code = \"forbid\"): only fabric and ring may allow unsafe code" >&2
  fail=1
else
  echo "unsafe code: only $(echo "$own_lints" | tr '\n' ' ')have their own lint table"
fi
exit "$fail"
