#!/usr/bin/env bash
# GET and PUT throughput of one object (default 1 GiB) with the aws CLI
# against a release storage-target on loopback. Prints one table and a JSON
# line. Usage: tests/bench/awscli-1g.sh [SIZE_MIB]
set -euo pipefail
cd "$(dirname "$0")/../.."
size_mib=${1:-1024}
bash .ci/setup.sh >/dev/null
cargo build --release --locked -q -p storage-target
export PATH="$PWD/.venv/bin:$PATH"

work=$(mktemp -d)
trap 'kill "${pid:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
cat >"$work/st.yaml" <<YAML
listen: 127.0.0.1:0
region: us-east-1
data_dir: $work/data
users:
  - access_key_id: bench
    secret: bench-secret
    buckets:
      - name: "*"
        access: read-write
YAML
"${CARGO_TARGET_DIR:-target}/release/storage-target" --config "$work/st.yaml" >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 100); do grep -q listening "$work/out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^storage-target listening on //p' "$work/out")
[ -n "$url" ] || { cat "$work/err"; exit 1; }

export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench-secret AWS_DEFAULT_REGION=us-east-1
export AWS_CONFIG_FILE="$work/aws-config" AWS_SHARED_CREDENTIALS_FILE=/dev/null
# The CLI's defaults (8 MiB parts, 10 concurrent requests), stated explicitly.
printf '[default]\ns3 =\n  addressing_style = path\n  multipart_chunksize = 8MB\n  max_concurrent_requests = 10\n' >"$AWS_CONFIG_FILE"
aws() { command aws --endpoint-url "$url" "$@"; }

head -c $((size_mib << 20)) /dev/urandom >"$work/src"
aws s3 mb s3://bench >/dev/null
secs() { date +%s.%N; }
t0=$(secs); aws s3 cp --only-show-errors "$work/src" s3://bench/obj; t1=$(secs)
t2=$(secs); aws s3 cp --only-show-errors s3://bench/obj "$work/dst"; t3=$(secs)
cmp "$work/src" "$work/dst"

awk -v b=$((size_mib << 20)) -v t0="$t0" -v t1="$t1" -v t2="$t2" -v t3="$t3" 'BEGIN {
  put = t1 - t0; get = t3 - t2
  printf "%-6s %10s %10s\n", "op", "seconds", "GB/s"
  printf "%-6s %10.2f %10.3f\n", "PUT", put, b / put / 1e9
  printf "%-6s %10.2f %10.3f\n", "GET", get, b / get / 1e9
  printf "{\"size_bytes\":%d,\"put_gbps\":%.4f,\"get_gbps\":%.4f}\n", b, b / put / 1e9, b / get / 1e9
}'
