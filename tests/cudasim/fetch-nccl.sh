#!/bin/sh
# Puts the REAL libnccl.so.2 (NVIDIA's NCCL, from the nvidia-nccl-cu12 wheel
# on PyPI, ~350 MB; the library is ~470 MB) into DIR (default:
# target/cuda-real under the workspace) and prints its path. Idempotent.
# Needs python3 with pip and network access to PyPI. NCCL_WHEEL_VERSION
# overrides the pinned version.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec sh "$here/fetch-wheel-lib.sh" "nvidia-nccl-cu12==${NCCL_WHEEL_VERSION:-2.32.3}" \
    nvidia/nccl/lib/libnccl.so.2 "${1:-$here/../../target/cuda-real}"
