#!/bin/sh
# Usage: fetch-wheel-lib.sh WHEEL==VERSION MEMBER DIR
# Extracts MEMBER (a library inside the PyPI wheel WHEEL==VERSION) into DIR
# under its basename and prints its path. Idempotent: does nothing when the
# file is already there. Needs python3 with pip and network access to PyPI.
# The common part of fetch-cudart.sh and fetch-nccl.sh.
set -eu
spec=$1 member=$2 dir=$3
lib=$(basename "$member")
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -s "$dir/$lib" ]; then
    echo "$dir/$lib"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$tmp" "$spec" >&2
python3 - "$tmp" "$dir" "$member" "$lib" <<'PY'
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
