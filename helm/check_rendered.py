"""Validate rendered charts and DPF examples (called by helm/check.sh).

usage: check_rendered.py render FILE...   kubernetes-validate every object,
                                          ServiceMonitors against a small schema,
                                          and each rendered s3dma config against
                                          the keys of the binary's example config
       check_rendered.py binaries FILE... each rendered s3dma config checked by the
                                          real binary in $S3DMA_BIN_DIR (--check)
       check_rendered.py dpf-values DIR FILE...
                                          write the dpu-agent chart values the
                                          DPF examples deploy with into DIR
       check_rendered.py dpf FILE...      DPUService, DPUServiceTemplate,
                                          DPUServiceConfiguration, DPUDeployment
                                          against schemas/ (+ their CEL rules)
"""
import base64
import grp
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile

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


# Rendered config key -> the binary that reads it (node-<name>.yaml: host-shim).
BINARIES = {"storage-target.yaml": "storage-target", "agent.yaml": "dpu-agent", "shim.yaml": "host-shim"}
# Where the charts mount the Secret and the ConfigMap (see the templates).
SECRET_DIR = "/etc/s3dma/secrets/"
CONFIG_DIR = "/etc/s3dma/config/"


def throwaway(key):
    """Content for a secret file the chart expects in an existing Secret."""
    # Fabric keys are hex (the binaries parse them); the charts generate *.key
    # the same way. Tokens and S3 secrets are opaque.
    return secrets.token_hex(32) if key.endswith(".key") else secrets.token_urlsafe(30)


def run_check(binary, cfg):
    """`binary --config cfg --check`; returns (ok, output)."""
    r = subprocess.run([binary, "--config", cfg, "--check"], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    return r.returncode == 0, (r.stdout + r.stderr).strip()


def binaries(files):
    """Check each rendered s3dma config with the binary that reads it."""
    bindir = os.environ.get("S3DMA_BIN_DIR", "")
    os.environ["RUST_BACKTRACE"] = "0"  # the binaries' errors without a backtrace
    errors, n = [], 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        variant = os.path.basename(path)
        # The chart's own Secret, when it renders one (else secrets.existingSecret).
        rendered_secret = None
        for d in docs:
            if d.get("kind") == "Secret":
                rendered_secret = rendered_secret or {}
                for k, v in (d.get("data") or {}).items():
                    rendered_secret[k] = base64.b64decode(v)
                for k, v in (d.get("stringData") or {}).items():
                    rendered_secret[k] = v.encode()
        for d in docs:
            if d.get("kind") != "ConfigMap":
                continue
            for name, text in (d.get("data") or {}).items():
                key = "shim.yaml" if re.fullmatch(r"node-.+\.yaml", name) else name
                if key not in BINARIES:
                    continue
                n += 1
                binary = os.path.join(bindir, BINARIES[key])
                where = f"{variant}: {name}"
                if not os.access(binary, os.X_OK):
                    errors.append(f"{where}: no executable {binary}")
                    continue
                ok, out, notes = check_one(binary, name, text, rendered_secret)
                how = "--check"
                note = f" [{'; '.join(notes)}]" if notes else ""
                if ok:
                    print(f"  ok   {where}: {BINARIES[key]} {how}{note}")
                else:
                    errors.append(f"{where}: {BINARIES[key]} {how}{note}:\n    " + out.replace("\n", "\n    "))
    return n, errors


def check_one(binary, name, text, rendered_secret):
    """Write the config and its secret files into a temp dir, rewrite the
    paths the charts mount (SECRET_DIR, CONFIG_DIR) to it, and run the binary.
    Returns (ok, output, notes on what else was adapted)."""
    notes = []
    with tempfile.TemporaryDirectory(prefix="s3dma-check-") as tmp:
        sdir, cdir = os.path.join(tmp, "secrets") + "/", os.path.join(tmp, "config") + "/"
        os.makedirs(sdir)
        os.makedirs(cdir)
        text = text.replace(SECRET_DIR, sdir).replace(CONFIG_DIR, cdir)
        named = sorted(set(re.findall(re.escape(sdir) + r"([^\"'\s,\]}]+)", text)))
        if rendered_secret is None:
            files = {k: throwaway(k).encode() for k in named}
            if named:
                notes.append("existingSecret: throwaway " + ", ".join(named))
        else:
            missing = [k for k in named if k not in rendered_secret]
            if missing:
                return False, f"the config names secret files the chart's Secret lacks: {', '.join(missing)}", notes
            files = rendered_secret
        for k, v in files.items():
            # Secret files must be private (the charts mount them 0400/0440).
            fd = os.open(os.path.join(sdir, k), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(v)
        # host-shim resolves a socket.group name on the node it runs on; a
        # name this machine lacks is checked as the current gid instead.
        parsed = yaml.safe_load(text) if os.path.basename(binary) == "host-shim" else None
        group = str(((parsed if isinstance(parsed, dict) else {}).get("socket") or {}).get("group") or "")
        if group and not group.isdigit():
            try:
                grp.getgrnam(group)
            except KeyError:
                line = re.compile(r'^(  group: )"?' + re.escape(group) + r'"?$', re.M)
                text, subs = line.subn(rf'\g<1>"{os.getgid()}"', text)
                if subs != 1:
                    return False, f"socket.group {group!r}: cannot substitute it (rendered differently)", notes
                notes.append(f"socket.group {group!r} is not a group here: checked as gid {os.getgid()}")
        cfg = os.path.join(cdir, name)
        with open(cfg, "w") as f:
            f.write(text)
        ok, out = run_check(binary, cfg)
        return ok, out.replace(tmp, "$TMP"), notes


DPF_KINDS = ("DPUService", "DPUServiceTemplate", "DPUServiceConfiguration", "DPUDeployment")


def dpf_reserved(keys, allow=None):
    """Label/annotation keys DPF reserves (the CRDs' CEL: no "dpu.nvidia.com/"
    inside, not ending in "dpu.nvidia.com"; `allow` is a CEL matches() regex)."""
    return [k for k in keys or {}
            if ("dpu.nvidia.com/" in k or k.endswith("dpu.nvidia.com")) and not (allow and re.search(allow, k))]


def config_ports_rules(cp, deploy_in_cluster, where, errors):
    if cp is None:
        return
    if deploy_in_cluster:
        errors.append(f"{where}: configPorts cannot be set when deployInCluster is true")
    if cp.get("serviceType", "NodePort") != "NodePort" and any("nodePort" in p for p in cp.get("ports", [])):
        errors.append(f"{where}: nodePort can only be set when serviceType is NodePort")


def dpf(files):
    schemas = {k: json.load(open(os.path.join(HERE, "schemas", f"{k.lower()}.schema.json"))) for k in DPF_KINDS}
    errors, n, objs = [], 0, []
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        for d in docs:
            kind = d.get("kind")
            where = f"{os.path.basename(path)}: {kind}/{d.get('metadata', {}).get('name')}"
            if d.get("apiVersion") != "svc.dpu.nvidia.com/v1alpha1":
                errors.append(f"{where}: apiVersion must be svc.dpu.nvidia.com/v1alpha1")
            if kind not in schemas:
                errors.append(f"{where}: no schema for kind {kind} in helm/schemas")
                continue
            n += 1
            objs.append((d, where))
            for e in jsonschema.Draft7Validator(schemas[kind]).iter_errors(d):
                errors.append(f"{where}: {'.'.join(str(p) for p in e.path)}: {e.message}")
            spec = d.get("spec", {})
            # CEL rules of the CRDs (x-kubernetes-validations).
            if kind == "DPUService":
                if spec.get("interfaces") and not spec.get("serviceID"):
                    errors.append(f"{where}: serviceID must be provided when interfaces are provided")
                config_ports_rules(spec.get("configPorts"), spec.get("deployInCluster"), where, errors)
            if kind == "DPUServiceConfiguration":
                sc = spec.get("serviceConfiguration", {})
                in_cluster = sc.get("deployInCluster", False)
                config_ports_rules(sc.get("configPorts"), in_cluster, where, errors)
                sds = sc.get("serviceDaemonSet", {})
                for k in dpf_reserved(sds.get("labels"), allow="svc.dpu.nvidia.com/custom-flows"):
                    errors.append(f"{where}: serviceDaemonSet label {k}: DPF reserves dpu.nvidia.com keys")
                for k in dpf_reserved(sds.get("annotations")):
                    errors.append(f"{where}: serviceDaemonSet annotation {k}: DPF reserves dpu.nvidia.com keys")
                if spec.get("interfaces") and in_cluster:
                    errors.append(f"{where}: interfaces are not supported when deploying in cluster")
                if in_cluster and spec.get("upgradePolicy", {}).get("applyNodeEffect", True):
                    errors.append(f"{where}: applyNodeEffect is not supported when deploying in cluster"
                                  " (set upgradePolicy.applyNodeEffect: false)")
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
                    for k in dpf_reserved(s.get("dpuAnnotations")):
                        errors.append(f"{where}: dpuAnnotations {k}: DPF reserves dpu.nvidia.com keys")
                for sw in spec.get("serviceChains", {}).get("switches", []):
                    for p in sw.get("ports", []):
                        if ("service" in p) == ("serviceInterface" in p):
                            errors.append(f"{where}: either service or serviceInterface per port")
    errors += dpf_references(objs)
    return n, errors


def dpf_references(objs):
    """What the DPUDeployment controller requires of the objects it ties
    together, where they are among the checked files: each services.<key>
    names a DPUServiceTemplate and a DPUServiceConfiguration (same namespace)
    whose spec.deploymentServiceName is <key>."""
    def key(d):
        m = d.get("metadata", {})
        return d.get("kind"), m.get("namespace", "default"), m.get("name")
    index = {key(d): d for d, _ in objs}
    errors = []
    for d, where in objs:
        if d.get("kind") != "DPUDeployment":
            continue
        ns = d.get("metadata", {}).get("namespace", "default")
        for svc, ref in (d.get("spec", {}).get("services") or {}).items():
            for kind, field in (("DPUServiceTemplate", "serviceTemplate"),
                                ("DPUServiceConfiguration", "serviceConfiguration")):
                other = index.get((kind, ns, ref.get(field)))
                if other is None:
                    continue  # not among the checked files
                got = other.get("spec", {}).get("deploymentServiceName")
                if got != svc:
                    errors.append(f"{where}: services.{svc}.{field}: {kind}/{ref.get(field)} has "
                                  f"deploymentServiceName {got!r}, not {svc!r}")
    return errors


def deep_merge(base, over):
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def dpf_values(outdir, files, chart="dpu-agent"):
    """Write the chart values each DPF example would deploy `chart` with, as
    dpf-<name>.values.yaml in outdir (check.sh renders them as variants):
    a DPUService's helmChart.values plus its serviceDaemonSet; for a
    DPUDeployment, per service, the DPUServiceTemplate's values deep-merged
    with the DPUServiceConfiguration's (which win), plus serviceDaemonSet from
    the configuration with the template's resourceRequirements as resources,
    as DPF injects them."""
    docs = []
    for path in files:
        with open(path) as f:
            docs += [d for d in yaml.safe_load_all(f) if d]
    by = {(d.get("kind"), d.get("metadata", {}).get("name")): d for d in docs}
    written = {}
    for d in docs:
        spec, name = d.get("spec", {}), d.get("metadata", {}).get("name")
        if d.get("kind") == "DPUService" and spec.get("helmChart", {}).get("source", {}).get("chart") == chart:
            v = dict(spec["helmChart"].get("values") or {})
            if "serviceDaemonSet" in spec:
                v["serviceDaemonSet"] = spec["serviceDaemonSet"]
            written[f"dpf-{name}"] = v
        if d.get("kind") == "DPUDeployment":
            for svc, ref in (spec.get("services") or {}).items():
                t = by.get(("DPUServiceTemplate", ref.get("serviceTemplate")), {}).get("spec", {})
                c = by.get(("DPUServiceConfiguration", ref.get("serviceConfiguration")), {}).get("spec", {})
                if t.get("helmChart", {}).get("source", {}).get("chart") != chart:
                    continue
                sc = c.get("serviceConfiguration", {})
                v = deep_merge(t["helmChart"].get("values") or {}, sc.get("helmChart", {}).get("values") or {})
                sds = dict(sc.get("serviceDaemonSet") or {})
                if t.get("resourceRequirements"):
                    sds["resources"] = t["resourceRequirements"]
                if sds:
                    v["serviceDaemonSet"] = sds
                written[f"dpf-{name}-{svc}"] = v
    for stem, v in written.items():
        with open(os.path.join(outdir, f"{stem}.values.yaml"), "w") as f:
            yaml.safe_dump(v, f, sort_keys=False)
    return written


def main():
    mode, files = sys.argv[1], sys.argv[2:]
    if mode == "dpf-values":
        for stem in dpf_values(files[0], files[1:]):
            print(f"    {stem}.values.yaml")
        return
    n, errors = {"render": render, "binaries": binaries, "dpf": dpf}[mode](files)
    for e in errors:
        print(f"  FAIL {e}")
    print(f"  {n} {'configs' if mode == 'binaries' else 'objects'} checked, {len(errors)} errors")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
