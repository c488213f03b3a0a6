#!/usr/bin/env bash
# Local mode (for now: the storage-target alone): builds the release binary,
# starts it on a free loopback port with a data directory under
# target/s3dma-local, and prints aws CLI lines to try. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p storage-target
state="$PWD/target/s3dma-local"
mkdir -p "$state/data"
cfg="$state/storage-target.yaml"
# The example config, with its data directory and port made local.
sed -e "s#^data_dir: .*#data_dir: $state/data#" \
    -e "s#^listen: .*#listen: 127.0.0.1:0#" \
    -e "s#^metrics_listen: .*#metrics_listen: 127.0.0.1:0#" \
    storage-target/storage-target.example.yaml >"$cfg"

key=$(sed -n 's/^ *- access_key_id: *//p' "$cfg" | head -n1)
secret=$(sed -n 's/^ *secret: *//p' "$cfg" | head -n1)

"${CARGO_TARGET_DIR:-target}/release/storage-target" --config "$cfg" | (
  while IFS= read -r line; do
    echo "$line"
    case "$line" in
      "storage-target listening on "*)
        url=${line#storage-target listening on }
        cat <<MSG

s3dma local mode is up (data in $state/data). Try, in another shell:

  export AWS_ACCESS_KEY_ID=$key AWS_SECRET_ACCESS_KEY=$secret AWS_DEFAULT_REGION=us-east-1
  aws --endpoint-url $url s3 mb s3://demo
  aws --endpoint-url $url s3 cp README.md s3://demo/README.md
  aws --endpoint-url $url s3 ls s3://demo/
  aws --endpoint-url $url s3 cp s3://demo/README.md -

(the aws CLI is in .venv/bin after .ci/setup.sh). Ctrl-C stops the server.
MSG
        ;;
    esac
  done
)
