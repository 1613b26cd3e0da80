#!/bin/sh
# Puts the REAL libnccl.so.2 (NVIDIA's NCCL, from the nvidia-nccl-cu12 wheel
# on PyPI, ~350 MB; the library is ~470 MB) into DIR (default:
# target/cuda-real under the workspace) and prints its path. Idempotent:
# does nothing when the file is already there. Needs python3 with pip and
# network access to PyPI. NCCL_WHEEL_VERSION overrides the pinned version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../target/cuda-real}
version=${NCCL_WHEEL_VERSION:-2.32.3}
lib=libnccl.so.2
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -s "$dir/$lib" ]; then
    echo "$dir/$lib"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$tmp" "nvidia-nccl-cu12==$version" >&2
python3 - "$tmp" "$dir" "nvidia/nccl/lib/$lib" "$lib" <<'PY'
import glob, os, shutil, sys, zipfile
src, dst, member, lib = sys.argv[1:5]
wheel = glob.glob(os.path.join(src, "*.whl"))[0]
tmp = os.path.join(dst, ".%s.%d" % (lib, os.getpid()))
with zipfile.ZipFile(wheel) as z, z.open(member) as f, open(tmp, "wb") as out:
    shutil.copyfileobj(f, out, 1 << 20)
os.chmod(tmp, 0o755)
os.rename(tmp, os.path.join(dst, lib))
PY
echo "$dir/$lib"
