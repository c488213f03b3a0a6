#!/usr/bin/env bash
# Builds the test-only CUDA driver stand-in (cuda_standin.c) as
# OUTDIR/libcuda.so.1 (default OUTDIR: target/cuda-standin, which git
# ignores) and prints the library's path. Point LD_LIBRARY_PATH at its
# directory to run fabric's `cuda` feature against it. Rebuilds only when
# the source or this script is newer than the library. Never ship it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$here/../../target/cuda-standin"}
mkdir -p "$out"
out=$(cd "$out" && pwd)
lib="$out/libcuda.so.1"
src="$here/cuda_standin.c"
if [ ! -e "$lib" ] || [ "$src" -nt "$lib" ] || [ "$here/build.sh" -nt "$lib" ]; then
    "${CC:-gcc}" -std=gnu11 -O2 -g -shared -fPIC -fvisibility=hidden \
        -Wall -Wextra -Werror -Wl,-soname,libcuda.so.1 -Wl,-z,defs \
        -o "$lib.tmp.$$" "$src" -pthread
    mv -f "$lib.tmp.$$" "$lib"
fi
echo "$lib"
