#!/usr/bin/env bash
# LMCache into .venv (made by .ci/setup.sh), for s3dma.lmcache's tests
# (tests/python/test_lmcache.py), on CPU. .ci/test.sh runs it before the
# Python suites; .ci/setup.sh does not, so running s3dma (README's first
# command) never installs LMCache.
#
# lmcache itself goes in without its requirements (they pin grpcio==1.78
# through grpcio-observability and protobuf<7, older than the stubs
# .ci/setup.sh generates, and pull CUDA wheels and servers its CPU path never
# imports), then what its engine and connectors do import
# (tests/requirements-lmcache.txt); pip warns that lmcache's pins are not
# met. About 45 s and 500 MB (llvmlite and numba 210 MB, transformers 130 MB,
# lmcache 95 MB). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

LMCACHE_VERSION=0.5.6
if ! .venv/bin/python - "$LMCACHE_VERSION" tests/requirements-lmcache.txt >/dev/null 2>&1 <<'EOF'
import importlib.metadata as m, re, sys
assert m.version("lmcache") == sys.argv[1]
for line in open(sys.argv[2]):
    name = re.split(r"[<>=!~;#\[ ]", line.strip(), maxsplit=1)[0]
    if name:
        m.version(name)
EOF
then
  echo "setup-lmcache: installing lmcache $LMCACHE_VERSION (CPU) into .venv"
  .venv/bin/pip install -q --no-deps "lmcache==$LMCACHE_VERSION"
  .venv/bin/pip install -q -r tests/requirements-lmcache.txt
fi
echo "setup-lmcache: ok"
