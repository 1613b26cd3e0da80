#!/bin/sh
# Builds the CUDA test stand-ins into DIR (default: target/cudasim under the
# workspace): DIR/libcuda.so.1, the timing simulator of the driver
# (cudadrvsim.c, soname libcuda.so.1; NOT CUDA), DIR/libcudart.so.12, the
# runtime stand-in over it (cudasim.c, soname libcudart.so.12; NOT CUDA),
# DIR/libfakekernels.so (kernels.c), DIR/libnccl.so.2 (ncclsim.c, a
# stand-in for NCCL; NOT NCCL), DIR/torch/libc10_cuda.so (torchsim.c, the
# USDT probes of PyTorch's caching allocator; NOT PyTorch), DIR/cuda_burst (cuda_burst.c, the
# burst driver) and, when
# fetch-cudart.sh has run, DIR/native_app (native_app.c, linked to the real
# libcudart.so.12 of target/cuda-real). Rebuilds
# only what is older than its source. Needs gcc.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../target/cudasim}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
build() { # out src extra...
    out=$1 src=$2
    shift 2
    if [ ! -e "$dir/$out" ] || [ "$here/$src" -nt "$dir/$out" ]; then
        gcc -O2 -g -Wall -shared -fPIC -o "$dir/.$out.$$" "$here/$src" "$@" -lpthread
        mv "$dir/.$out.$$" "$dir/$out"
    fi
}
build libcuda.so.1 cudadrvsim.c -Wl,-soname,libcuda.so.1
# The runtime stand-in calls the driver stand-in next to it.
if [ "$dir/libcuda.so.1" -nt "$dir/libcudart.so.12" ]; then rm -f "$dir/libcudart.so.12"; fi
build libcudart.so.12 cudasim.c -Wl,-soname,libcudart.so.12 "-Wl,-rpath,\$ORIGIN" "$dir/libcuda.so.1"
build libfakekernels.so kernels.c
build libnccl.so.2 ncclsim.c -Wl,-soname,libnccl.so.2 -ldl
# PyTorch's allocator stand-in with its USDT probes (sys/sdt.h, Debian's
# systemtap-sdt-dev), in a directory of its own: torch/libc10_cuda.so.
top=$dir
dir=$top/torch
mkdir -p "$dir"
build libc10_cuda.so torchsim.c -Wl,-soname,libc10_cuda.so
dir=$top
# The burst driver (cuda_burst.c): dlopens $CUDART, so it runs on a private copy.
if [ ! -e "$dir/cuda_burst" ] || [ "$here/cuda_burst.c" -nt "$dir/cuda_burst" ]; then
    gcc -O1 -g -fno-omit-frame-pointer -Wall -o "$dir/.cuda_burst.$$" "$here/cuda_burst.c" -ldl -lpthread
    mv "$dir/.cuda_burst.$$" "$dir/cuda_burst"
fi
# A native program linked to the real libcudart, when it is there (fetch-cudart.sh).
real=$here/../../target/cuda-real
if [ -s "$real/libcudart.so.12" ]; then
    real=$(cd "$real" && pwd)
    if [ ! -e "$dir/native_app" ] || [ "$here/native_app.c" -nt "$dir/native_app" ]; then
        gcc -O1 -g -fno-omit-frame-pointer -Wall -o "$dir/.native_app.$$" "$here/native_app.c" \
            "$real/libcudart.so.12" -Wl,-rpath,"$real"
        mv "$dir/.native_app.$$" "$dir/native_app"
    fi
fi
echo "$dir"
