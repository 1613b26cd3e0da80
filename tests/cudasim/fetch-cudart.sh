#!/bin/sh
# Puts the REAL libcudart.so.12 (NVIDIA's CUDA runtime, from the
# nvidia-cuda-runtime-cu12 wheel on PyPI) into DIR (default: target/cuda-real
# under the workspace) and prints its path; with CUDART_MAJOR=13, the real
# libcudart.so.13 (nvidia-cuda-runtime wheel, nvidia/cu13/lib: what PyTorch
# cu13 loads). Idempotent: does nothing when the file is already there.
# Needs python3 with pip and network access to PyPI. CUDART_WHEEL_VERSION
# overrides the pinned wheel version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../target/cuda-real}
major=${CUDART_MAJOR:-12}
case $major in
12) wheel=nvidia-cuda-runtime-cu12 version=${CUDART_WHEEL_VERSION:-12.9.79} member=nvidia/cuda_runtime/lib ;;
13) wheel=nvidia-cuda-runtime version=${CUDART_WHEEL_VERSION:-13.5.37} member=nvidia/cu13/lib ;;
*) echo "CUDART_MAJOR: 12 or 13, not $major" >&2; exit 2 ;;
esac
lib=libcudart.so.$major
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -s "$dir/$lib" ]; then
    echo "$dir/$lib"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$tmp" "$wheel==$version" >&2
python3 - "$tmp" "$dir" "$member/$lib" "$lib" <<'PY'
import glob, os, sys, zipfile
src, dst, member, lib = sys.argv[1:5]
wheel = glob.glob(os.path.join(src, "*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read(member)
tmp = os.path.join(dst, ".%s.%d" % (lib, os.getpid()))
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.rename(tmp, os.path.join(dst, lib))
PY
echo "$dir/$lib"
