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
exec sh "$here/fetch-wheel-lib.sh" "$wheel==$version" "$member/libcudart.so.$major" "$dir"
