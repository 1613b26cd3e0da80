#!/bin/sh
# Puts the REAL libcudart.so.12 (NVIDIA's CUDA runtime, from the
# nvidia-cuda-runtime-cu12 wheel on PyPI) into DIR (default: target/cuda-real
# under the workspace) and prints its path. Idempotent: does nothing when the
# file is already there. Needs python3 with pip and network access to PyPI.
# CUDART_WHEEL_VERSION overrides the pinned wheel version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../target/cuda-real}
version=${CUDART_WHEEL_VERSION:-12.9.79}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -s "$dir/libcudart.so.12" ]; then
    echo "$dir/libcudart.so.12"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$tmp" "nvidia-cuda-runtime-cu12==$version" >&2
python3 - "$tmp" "$dir" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
wheel = glob.glob(os.path.join(src, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("nvidia/cuda_runtime/lib/libcudart.so.12")
tmp = os.path.join(dst, ".libcudart.so.12.%d" % os.getpid())
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.rename(tmp, os.path.join(dst, "libcudart.so.12"))
PY
echo "$dir/libcudart.so.12"
