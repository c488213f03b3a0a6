"""The test binaries a `cargo test --no-run --message-format=json...` built.

Reads cargo's JSON messages on stdin and prints one line per test binary:
``DIRNAME|TARGET|PACKAGE|DIR|EXECUTABLE`` (DIRNAME is the package
directory's name, e.g. ``e2e`` for s3dma-e2e; TARGET the test target, e.g. ``it``).
Used by .ci/cargo-test-run.sh and .ci/verbs-tests.sh.
"""

import json
import os
import sys

for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable") or not m["profile"]["test"]:
        continue
    d = os.path.dirname(m["manifest_path"])
    # "path+file:///repo/tools#s3dma-tools@0.1.0", or "...#0.1.0" when the
    # package is named after its directory.
    url, _, frag = m["package_id"].partition("#")
    name = frag.split("@")[0] if "@" in frag else url.rstrip("/").rsplit("/", 1)[-1]
    print("|".join([os.path.basename(d), m["target"]["name"], name, d, m["executable"]]))
