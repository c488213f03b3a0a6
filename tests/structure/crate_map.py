#!/usr/bin/env python3
"""Checks that docs/ARCHITECTURE.md's crate map matches `cargo metadata`.

The map is the first table of the "## Crate map" section, one row per
workspace crate: | `crate` | `folder/` | `dep`, `dep` (or —) | what it is |.
Every workspace member must have a row, with its folder and exactly its
normal (non-dev, non-build) dependencies on other workspace crates.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout
)
members = {p["name"]: p for p in meta["packages"]}
actual = {}
for name, p in members.items():
    deps = {d["rename"] or d["name"] for d in p["dependencies"]
            if d["kind"] is None and d["name"] in members}
    folder = str(Path(p["manifest_path"]).parent.relative_to(root)) + "/"
    actual[name] = (folder, deps)

doc = (root / "docs" / "ARCHITECTURE.md").read_text()
m = re.search(r"^## Crate map\n(.*?)(?=^## )", doc, flags=re.S | re.M)
if not m:
    sys.exit("docs/ARCHITECTURE.md: no '## Crate map' section")
rows = {}
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 4 or not cells[0].startswith("`"):
        continue
    name = cells[0].strip("`")
    folder = cells[1].strip("`")
    # Crate names in backticks (other words, e.g. a feature, are prose).
    deps = {d for d in re.findall(r"`([^`]+)`", cells[2]) if d in members}
    rows[name] = (folder, deps)

problems = []
for name, (folder, deps) in sorted(actual.items()):
    if name not in rows:
        problems.append(f"{name}: missing from the crate map")
        continue
    dfolder, ddeps = rows[name]
    if dfolder != folder:
        problems.append(f"{name}: the map says folder {dfolder}, cargo says {folder}")
    if ddeps != deps:
        problems.append(
            f"{name}: the map says it depends on {sorted(ddeps) or 'nothing'}, "
            f"cargo says {sorted(deps) or 'nothing'}"
        )
for name in sorted(set(rows) - set(actual)):
    problems.append(f"{name}: in the crate map but not a workspace crate")
if problems:
    print("docs/ARCHITECTURE.md crate map is out of date:")
    print("\n".join("  " + p for p in problems))
    sys.exit(1)
print(f"crate map: {len(actual)} crates, dependencies match cargo metadata")
