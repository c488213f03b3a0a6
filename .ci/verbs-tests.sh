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
#   - s3dma-e2e `agent::`: the dpu-agent's transfers and HTTP fallback,
#     agent, target and tenant memory on verbs;
#   - s3dma-e2e `shim::e2e::`: the whole stack (shim, agent, target on
#     verbs) through the Rust client.
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
  # nothing is rebuilt after its `cargo test`), one "NAME|DIR|EXE|FILTERS" line
  # for each run of a binary that has verbs suites, with the libtest filters
  # it runs (the end-to-end binary runs three times, agent, verbs rails and
  # shim suites in three processes, so that they run side by side):
  #   - fabric: the verbs unit tests and the conformance suite's verbs variants;
  #   - storage-target: the RDMA GET/PUT/UploadPart suite, the s3dma batch
  #     request and the hipobj-rc-v2 server against a protocol client;
  #   - s3dma-e2e `agent::`: transfers and the HTTP fallback (third-party
  #     servers, Ceph's radosgw and moto, are reached over HTTP only: their
  #     fallback tests run on the host, not under the VM's emulated CPUs);
  #   - s3dma-e2e `verbs_rails::` (its own run: 157 s in the VM at stop
  #     53, 680 s before the tests' kit was optimised): two rails on rxe0
  #     and rxe1, s3dma and hipobj-rc-v2 striped, rxe1 cut and restored
  #     mid-transfer;
  #   - s3dma-e2e `shim::e2e::`, `shim::batch::`: the whole stack through the
  #     Rust client, single and batched; `cli::remote::`: `s3dma local
  #     --target --protocol hipobj-rc-v2 --fabric verbs` against another
  #     local stack's storage-target;
  #   - s3dma-tools: `probe` moving a test object both ways by hipobj-rc-v2.
  cargo test --workspace --all-features --locked --no-run --message-format=json-render-diagnostics |
    python3 .ci/test-binaries.py |
    awk -F'|' '
      BEGIN {
        f["fabric|fabric"] = "verbs::"
        f["fabric|it"] = "conformance::verbs::"
        f["storage-target|it"] = "rdma:: hipobj:: dc:: batch::"
        # Runs of one binary are separated by ";".
        f["e2e|it"] = "agent::transfers:: agent::fallback:: agent::batch_target:: --skip ceph --skip third_party;verbs_rails::;shim::e2e:: shim::batch:: cli::remote::"
        f["tools|it"] = "probe::probe_reports_a_storage_targets_dialects"
      }
      ($1 "|" $2) in f {
        n = split(f[$1 "|" $2], runs, ";")
        for (i = 1; i <= n; i++) print $3 " " $2 "|" $4 "|" $5 "|" runs[i]
      }' |
    # The longest suites first (seconds in the VM at stop 52, before the
    # tests' kit was optimised: verbs rails about 680, agent about 480,
    # shim e2e 410, rdma and hipobj 365, conformance 80; verbs rails 157
    # at stop 53).
    awk -F'|' '{ w = $4 ~ /^verbs_rails::/ ? 6 : $4 ~ /^agent::/ ? 5 : $4 ~ /^shim::/ ? 4 : /^storage-target/ ? 3 : / it\|/ ? 2 : 1; print w "|" $0 }' |
    sort -t'|' -k1,1nr | cut -d'|' -f2- >"$LIST"
  if [ "$(wc -l <"$LIST")" -ne 7 ]; then
    echo "verbs-tests: expected 7 runs of 5 test binaries, found:" >&2
    cat "$LIST" >&2
    exit 1
  fi
  echo "verbs-tests: $(wc -l <"$LIST") test runs built; booting the VM"
  S3DMA_VM_TIMEOUT="${S3DMA_VM_TIMEOUT:-2700}" exec bash .ci/rdma-vm.sh bash .ci/verbs-tests.sh
fi

# Inside the VM.
export S3DMA_TEST_FABRIC=verbs
# 128 MiB instead of 1 GiB for the "large object" cases: emulated CPUs
# (still many chunks, two 64 MiB parts, tens of thousands of packets).
export S3DMA_TEST_LARGE_OBJECT=$((128 << 20))
export RUST_BACKTRACE="${RUST_BACKTRACE:-0}"
device="$(ibv_devices | awk 'NR > 2 {print $1}' | paste -sd, -)"
if [ -z "$device" ]; then
  echo "verbs-tests: FAILED: no RDMA device in the VM"
  exit 1
fi
echo "verbs-tests: on $device, ${S3DMA_VM_TEST_JOBS:-2} binaries at a time"
# Two binaries at a time: the suites wait on services and sockets, so one
# at a time left the two emulated CPUs idle a good part of the step.
bash .ci/run-test-binaries.sh verbs-tests "${S3DMA_VM_TEST_JOBS:-2}" "$ROOT/$LIST" --no-skips \
  -- --test-threads 2
# The hipobj-rc-v2 client path through a whole local stack, measured
# beside s3dma's own exchange would be noise under emulation: the bench
# only proves that every transfer took the RDMA path (it fails otherwise),
# so one round of each cell is enough (three took about 130 s at stop 53).
start=$(date +%s)
log=target/rdma-vm/bench-hipobj.log
if ! target/debug/s3dma-tools bench --quick --rounds 1 --fabric verbs --protocol hipobj-rc-v2 --only large \
  --json target/rdma-vm/bench-hipobj.json >"$log" 2>&1; then
  cat "$log"
  echo "verbs-tests: FAILED: bench --protocol hipobj-rc-v2"
  exit 1
fi
grep -E "^  (8|64) MiB|^  limits" "$log" || true
echo "verbs-tests: bench --protocol hipobj-rc-v2 ok in $(( $(date +%s) - start )) s"
# `s3dma local --fabric verbs`: its printed S3 endpoint and key work for a
# hipobj-rc-v2 client in the same VM (`s3dma-tools probe`, its own QP).
start=$(date +%s)
local_dir="$(mktemp -d)"
local_out="$local_dir/out"
HOME="$local_dir" target/debug/s3dma local --fabric verbs --dir "$local_dir/state" \
  --socket "$local_dir/shim.sock" >"$local_out" 2>&1 &
local_pid=$!
for _ in $(seq 1 300); do
  grep -q "s3dma local ready" "$local_out" && break
  kill -0 "$local_pid" 2>/dev/null || break
  sleep 1
done
key="$(grep -o 'AWS_ACCESS_KEY_ID=[^ ]*' "$local_out" | head -1 | cut -d= -f2)"
url="$(grep -o 'aws --endpoint-url [^ ]*' "$local_out" | head -1 | awk '{print $3}')"
if [ -z "$key" ] || [ -z "$url" ]; then
  cat "$local_out"
  echo "verbs-tests: FAILED: s3dma local --fabric verbs did not start"
  exit 1
fi
if ! AWS_ACCESS_KEY_ID="$key" AWS_SECRET_ACCESS_KEY="$(cat "$local_dir/state/secrets/tenant.secret")" \
  target/debug/s3dma-tools probe --endpoint "$url" --bucket data --fabric verbs >"$local_dir/probe" 2>&1 ||
  ! grep -q "ok      hipobj-rc-v2: GET" "$local_dir/probe" ||
  ! grep -q "ok      hipobj-rc-v2: PUT" "$local_dir/probe"; then
  cat "$local_dir/probe" "$local_out"
  kill -INT "$local_pid" 2>/dev/null || true
  echo "verbs-tests: FAILED: probe against s3dma local --fabric verbs"
  exit 1
fi
kill -INT "$local_pid"
wait "$local_pid" || true
echo "verbs-tests: s3dma local --fabric verbs served a hipobj-rc-v2 client in $(( $(date +%s) - start )) s"
echo "verbs-tests: ok (none skipped)"
