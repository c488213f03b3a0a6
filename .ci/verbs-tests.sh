#!/usr/bin/env bash
# The verbs suites on a real kernel verbs stack: Soft-RoCE (rdma_rxe) in the
# VM of .ci/rdma-vm.sh, booted once, with `verbs` everywhere.
#
#   bash .ci/verbs-tests.sh
#
# Here (on the host) it lists the test binaries cargo built (building them
# if needed), then runs itself inside the VM, which runs those binaries (no
# compiling under emulation):
#   - fabric: the verbs unit tests and the conformance suite's verbs variants;
#   - storage-target: the RDMA GET/PUT/UploadPart suite, target and tenant on verbs;
#   - dpu-agent: transfers and the HTTP fallback, agent, target and tenant
#     memory on verbs;
#   - host-shim: the whole stack (shim, agent, target on verbs) through the
#     Rust client.
# The end-to-end suites take their fabric from S3DMA_TEST_FABRIC. Inside the
# VM a missing RDMA device fails a test instead of skipping it, and any
# "SKIPPED" line fails the run. Ends with the device and the test counts.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
LIST="target/rdma-vm/verbs-tests.list"

if [ -z "${S3DMA_RDMA_VM:-}" ]; then
  mkdir -p target/rdma-vm
  # The test binaries of the workspace's one feature set (as .ci/test.sh:
  # nothing is rebuilt after its `cargo test`), one "DIR|FILTERS|EXE" line
  # for each binary that has verbs suites, with the libtest filters it runs:
  #   - fabric: the verbs unit tests and the conformance suite's verbs variants;
  #   - storage-target: the RDMA GET/PUT/UploadPart suite and the
  #     hipobj-rc-v2 server against a protocol client;
  #   - dpu-agent: transfers and the HTTP fallback (third-party servers,
  #     Ceph's radosgw and moto, are reached over HTTP only: their fallback
  #     tests run on the host, not under the VM's emulated CPUs);
  #   - host-shim: the whole stack through the Rust client.
  cargo test --workspace --all-features --locked --no-run --message-format=json-render-diagnostics |
    python3 .ci/test-binaries.py |
    awk -F'|' '
      BEGIN {
        f["fabric|fabric"] = "verbs::"
        f["fabric|it"] = "conformance::verbs::"
        f["storage-target|it"] = "rdma:: hipobj::"
        f["dpu-agent|it"] = "transfers:: fallback:: --skip ceph --skip third_party"
        f["host-shim|it"] = "e2e::"
      }
      ($1 "|" $2) in f { print $4 "|" f[$1 "|" $2] "|" $5 }' >"$LIST"
  if [ "$(wc -l <"$LIST")" -ne 5 ]; then
    echo "verbs-tests: expected 5 test binaries, found:" >&2
    cat "$LIST" >&2
    exit 1
  fi
  echo "verbs-tests: $(wc -l <"$LIST") test binaries built; booting the VM"
  S3DMA_VM_TIMEOUT="${S3DMA_VM_TIMEOUT:-2700}" exec bash .ci/rdma-vm.sh bash .ci/verbs-tests.sh
fi

# Inside the VM.
export S3DMA_TEST_FABRIC=verbs
# 256 MiB instead of 1 GiB for the "large object" cases: emulated CPUs.
export S3DMA_TEST_LARGE_OBJECT=$((256 << 20))
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"
device="$(ibv_devices | awk 'NR > 2 {print $1}' | paste -sd, -)"
passed=0 failed=0 ignored=0 bad=0
start=$SECONDS
while IFS='|' read -r dir filter exe; do
  name="$(basename "$exe")"
  echo
  echo "==> ${name%-*} ${filter:-(all)} on ${device:-no device}"
  out="$(mktemp)"
  set +e
  # shellcheck disable=SC2086 # an empty filter is no argument
  (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" $filter --test-threads 2) 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  counts="$(awk '/^test result:/ {
      for (k = 1; k <= NF; k++) {
        if ($(k+1) ~ /^passed/) p += $k
        if ($(k+1) ~ /^failed/) f += $k
        if ($(k+1) ~ /^ignored/) i += $k
      }
    } END { print p + 0, f + 0, i + 0 }' "$out")"
  read -r p f i <<<"$counts"
  passed=$((passed + p)) failed=$((failed + f)) ignored=$((ignored + i))
  if grep -q "SKIPPED" "$out"; then
    echo "verbs-tests: $name skipped tests inside the VM"
    bad=$((bad + 1))
  fi
  if [ "$rc" -ne 0 ]; then
    echo "verbs-tests: $name exited $rc"
    bad=$((bad + 1))
  fi
  rm -f "$out"
done <"$ROOT/$LIST"
echo
echo "verbs-tests: device ${device:-none}: $passed passed, $failed failed, $ignored ignored" \
  "(helpers the suites run as child processes), none skipped; $((SECONDS - start))s in the VM"
if [ "$bad" -ne 0 ] || [ "$passed" -eq 0 ] || [ -z "$device" ]; then
  echo "verbs-tests: FAILED"
  exit 1
fi
echo "verbs-tests: ok"
