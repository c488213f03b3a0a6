"""Validate rendered charts and DPF examples (called by helm/check.sh).

usage: check_rendered.py render FILE...   kubernetes-validate every object,
                                          ServiceMonitors against a small schema,
                                          and each rendered s3dma config against
                                          the keys of the binary's example config
       check_rendered.py dpf FILE...      DPUService/DPUDeployment against schemas/
"""
import json
import os
import sys

import jsonschema
import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
K8S_VERSION = os.environ.get("K8S_VERSION", "1.30")

# Rendered config key -> example config of the binary that reads it.
EXAMPLES = {
    "storage-target.yaml": "storage-target/storage-target.example.yaml",
    "agent.yaml": "dpu-agent/dpu-agent.example.yaml",
    "shim.yaml": "host-shim/host-shim.example.yaml",
}
# Optional fields that are commented out in the examples.
OPTIONAL = {
    "agent.yaml": {"listen.tls", "listen.tls.cert_file", "listen.tls.key_file", "listen.tls.client_ca_file",
                   "shims[].tls_name", "targets[].ca_file", "tenants[].allow[].prefix"},
    "shim.yaml": {"socket.group", "fabric.advertise", "agent.tls", "agent.tls.ca_file", "agent.tls.server_name",
                  "agent.tls.cert_file", "agent.tls.key_file", "tenants[].uids", "tenants[].gids",
                  "tenants[].max_concurrent_requests"},
    "storage-target.yaml": {"users[].secret_file"},
}

SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {"type": "object"},
                "namespaceSelector": {"type": "object"},
                "endpoints": {
                    "type": "array", "minItems": 1,
                    "items": {"type": "object", "required": ["port"],
                              "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                             "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                             "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}}},
                },
            },
        },
    },
}


def paths(node, prefix=""):
    out = set()
    if isinstance(node, dict):
        for k, v in node.items():
            p = f"{prefix}.{k}" if prefix else k
            out.add(p)
            out |= paths(v, p)
    elif isinstance(node, list):
        for v in node:
            out |= paths(v, prefix + "[]")
    return out


def example_paths(name):
    with open(os.path.join(ROOT, EXAMPLES[name])) as f:
        return paths(yaml.safe_load(f)) | OPTIONAL.get(name, set())


def check_config(name, text, errors, where):
    key = "shim.yaml" if name.startswith("node-") else name
    if key not in EXAMPLES:
        return
    cfg = yaml.safe_load(text)
    unknown = sorted(paths(cfg) - example_paths(key))
    if unknown:
        errors.append(f"{where}: {name}: fields not in {EXAMPLES[key]}: {', '.join(unknown)}")


def render(files):
    errors, n = [], 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            n += 1
            where = f"{os.path.basename(path)}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
            if d.get("kind") == "ServiceMonitor":
                try:
                    jsonschema.validate(d, SERVICE_MONITOR)
                except jsonschema.ValidationError as e:
                    errors.append(f"{where}: {e.message}")
                continue
            try:
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{where}: {'.'.join(str(p) for p in e.path)}: {e.message}")
            except Exception as e:  # noqa: BLE001 (unknown kinds, schema lookup failures)
                errors.append(f"{where}: {type(e).__name__}: {e}")
            if d.get("kind") == "ConfigMap":
                for name, text in (d.get("data") or {}).items():
                    check_config(name, text, errors, where)
    return n, errors


def dpf(files):
    schemas = {k: json.load(open(os.path.join(HERE, "schemas", f"{k.lower()}.schema.json")))
               for k in ("DPUService", "DPUDeployment")}
    errors, n = [], 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            kind = d.get("kind")
            where = f"{os.path.basename(path)}: {kind}/{d.get('metadata', {}).get('name')}"
            if d.get("apiVersion") != "svc.dpu.nvidia.com/v1alpha1":
                errors.append(f"{where}: apiVersion must be svc.dpu.nvidia.com/v1alpha1")
            if kind not in schemas:
                continue  # DPUServiceTemplate/Configuration: no schema saved here
            n += 1
            for e in jsonschema.Draft7Validator(schemas[kind]).iter_errors(d):
                errors.append(f"{where}: {'.'.join(str(p) for p in e.path)}: {e.message}")
            spec = d.get("spec", {})
            # CEL rules of the CRDs (x-kubernetes-validations).
            if kind == "DPUService" and spec.get("interfaces") and not spec.get("serviceID"):
                errors.append(f"{where}: serviceID must be provided when interfaces are provided")
            if kind == "DPUService" and spec.get("deployInCluster") and "configPorts" in spec:
                errors.append(f"{where}: configPorts cannot be set when deployInCluster is true")
            if kind == "DPUDeployment":
                sets = spec.get("dpus", {}).get("dpuSets", [])
                sfx = [s.get("nameSuffix") for s in sets]
                if len(sfx) != len(set(sfx)):
                    errors.append(f"{where}: DPUSet.NameSuffix values must be unique")
                for s in sets:
                    if "nodeSelector" in s and "dpuNodeSelector" in s:
                        errors.append(f"{where}: only one of nodeSelector or dpuNodeSelector")
                    if "dpuSelector" in s and "dpuDeviceSelector" in s:
                        errors.append(f"{where}: only one of dpuSelector or dpuDeviceSelector")
                for sw in spec.get("serviceChains", {}).get("switches", []):
                    for p in sw.get("ports", []):
                        if ("service" in p) == ("serviceInterface" in p):
                            errors.append(f"{where}: either service or serviceInterface per port")
    return n, errors


def main():
    mode, files = sys.argv[1], sys.argv[2:]
    n, errors = (render if mode == "render" else dpf)(files)
    for e in errors:
        print(f"  FAIL {e}")
    print(f"  {n} objects checked, {len(errors)} errors")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
