#!/usr/bin/env python3
"""Only `dialect/` modules (and config parsing and validation) match on the
dialect enums.

The dialect enums are the `enum ...Protocol` and `enum Dialect` types of
storage-target, dpu-agent and s3dma-wire (found in their sources, so a new
one is covered), under their own names and any `use ... as Alias` name. A
match arm on one of their variants (`Enum::Variant =>`, also inside an
or-pattern) or a `matches!(x, Enum::...)` counts as a match on it; it is
allowed in files under a `dialect/` directory of a crate's `src/`, under
`src/config/` and in the `config/` crate. The `#[cfg(test)]` module at the
end of a file is not looked at. Prints every offending line and exits 1 if
there is one.
"""

import re
import sys
from pathlib import Path

root = Path(__file__).resolve().parents[2]
ENUM_CRATES = ["storage-target", "dpu-agent", "wire"]

enum_re = re.compile(r"^\s*pub(?:\([^)]*\))?\s+enum\s+(\w*Protocol|Dialect)\b", re.M)
enums = set()
for crate in ENUM_CRATES:
    for f in (root / crate / "src").rglob("*.rs"):
        enums.update(enum_re.findall(f.read_text(errors="replace")))
if not enums:
    sys.exit("dialect matches: no dialect enum found (enum ...Protocol or enum Dialect)")


def allowed(rel: Path) -> bool:
    parts = rel.parts
    if parts[0] == "config":
        return True
    if len(parts) < 3 or parts[1] != "src":
        return True  # not a crate's source (tests, benches, build scripts)
    inner = parts[2:-1]
    return "dialect" in inner or (inner[:1] == ("config",))


def strip_tests(text: str) -> str:
    """The text before the file's `#[cfg(test)] mod ...` (kept line count)."""
    m = re.search(r"^\s*#\[cfg\(test\)\]\s*\n\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+", text, re.M)
    return text if not m else text[: m.start()]


sources = [p for p in root.glob("*/src/**/*.rs") if "target" not in p.parts[len(root.parts):][:1]]
problems = []
for f in sorted(sources):
    rel = f.relative_to(root)
    if allowed(rel):
        continue
    text = strip_tests(f.read_text(errors="replace"))
    names = set(enums)
    for enum, alias in re.findall(r"\b(" + "|".join(sorted(enums)) + r")\s+as\s+(\w+)", text):
        names.add(alias)
    alt = "|".join(sorted(names))
    # `Enum::Variant` somewhere in a pattern that ends in `=>` on the line
    # (a tuple, an or-pattern, a guard); not `x = Enum::V;` nor `==`.
    arm = re.compile(r"\b(?:" + alt + r")::[A-Z]\w*(?:[^;=]|=>(?=.*=>))*=>")
    mat = re.compile(r"matches!\([^;]*?\b(?:" + alt + r")::")
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("//"):
            continue
        if arm.search(line) or mat.search(line):
            problems.append(f"{rel}:{n}: {line.strip()}")

if problems:
    print(
        f"dialect matches: {len(problems)} match(es) on a dialect enum ({', '.join(sorted(enums))}) "
        "outside dialect/ and config modules:",
        file=sys.stderr,
    )
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    sys.exit(1)
print(f"dialect matches: {', '.join(sorted(enums))} matched only in dialect/ and config modules")
