#!/usr/bin/env python3
"""Fails if the modules of a crate import each other in a circle.

Usage: module_cycles.py CRATE_SRC_DIR [...]

A module's dependencies are the `crate::...` and `super::...` paths its
non-test code names (in `use` items and inline), resolved to the deepest
module of the crate they name; a name re-exported by the crate root
(`pub use region::Domain`) counts as its defining module. Declaring a child
module (`mod x;`) is not a dependency. `#[cfg(test)]` test modules are left
out: tests may reach anywhere.
"""

import re
import sys
from pathlib import Path


def module_of(src: Path, f: Path) -> str:
    rel = f.relative_to(src).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("lib", "main", "mod"):
        parts = parts[:-1]
    return "::".join(parts)


def strip_tests(text: str) -> str:
    m = re.search(r"#\[cfg\(test\)\]\s*mod \w+\s*\{", text)
    return text[: m.start()] if m else text


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def expand_use_groups(text: str):
    """Yields full paths from `use a::{b, c::{d}}` trees (crate/super only)."""
    for m in re.finditer(r"\buse\s+((?:crate|super)(?:::\w+)*)::\{", text):
        start = m.end()
        depth, i = 1, start
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        yield from expand(m.group(1), text[start : i - 1])


def expand(prefix: str, body: str):
    depth, item = 0, ""
    items = []
    for ch in body:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        item += ch
    items.append(item)
    for it in (x.strip() for x in items):
        if not it:
            continue
        if "{" in it:
            head, rest = it.split("{", 1)
            yield from expand(prefix + "::" + head.rstrip(":").strip(), rest.rsplit("}", 1)[0])
        else:
            yield prefix + "::" + it.split(" as ")[0].strip()


def main() -> int:
    failed = False
    for arg in sys.argv[1:]:
        src = Path(arg)
        files = {module_of(src, f): f for f in sorted(src.rglob("*.rs")) if "bin" not in f.parts}
        modules = set(files)
        root = files.get("")
        reexports = {}
        if root:
            for m in re.finditer(r"pub use ([\w:]+)::\{([^}]*)\};|pub use ([\w:]+)::(\w+);", root.read_text()):
                if m.group(1):
                    for name in m.group(2).split(","):
                        name = name.strip().split(" as ")[-1]
                        if name:
                            reexports[name] = m.group(1)
                else:
                    reexports[m.group(4)] = m.group(3)
        edges = {m: set() for m in modules}
        for mod, f in files.items():
            text = strip_comments(strip_tests(f.read_text()))
            paths = set(expand_use_groups(text))
            paths |= set(re.findall(r"\b(?:crate|super)(?:::\w+)+", text))
            for p in paths:
                parts = p.split("::")
                here = mod.split("::") if mod else []
                while parts and parts[0] == "super":
                    here = here[:-1]
                    parts = parts[1:]
                if parts and parts[0] == "crate":
                    here, parts = [], parts[1:]
                if not here and parts and parts[0] in reexports and parts[0] not in modules:
                    parts = reexports[parts[0]].split("::")
                target = None
                for n in range(len(parts), -1, -1):
                    cand = "::".join(here + parts[:n])
                    if cand in modules:
                        target = cand
                        break
                if target is None or target == mod:
                    continue
                # A parent naming its own descendant's items is not a cycle risk
                # we track here only if it is a real import; keep every edge.
                edges[mod].add(target)
        # Cycle search (Tarjan's strongly connected components).
        index, low, stack, on, sccs = {}, {}, [], set(), []
        counter = [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in edges[v]:
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    sccs.append(sorted(comp))

        sys.setrecursionlimit(10000)
        for v in sorted(modules):
            if v not in index:
                visit(v)
        name = src.parent.name
        if sccs:
            failed = True
            for comp in sccs:
                print(f"{name}: modules import each other in a circle: {', '.join(c or '(root)' for c in comp)}")
                for c in comp:
                    print(f"  {c or '(root)'} -> {', '.join(sorted(t or '(root)' for t in edges[c] if t in comp))}")
        else:
            n = sum(len(e) for e in edges.values())
            print(f"{name}: {len(modules)} modules, {n} imports between them, no cycle")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
