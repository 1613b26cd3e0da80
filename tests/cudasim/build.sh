#!/bin/sh
# Builds the CUDA test stand-ins into DIR (default: target/cudasim under the
# workspace): DIR/libcudart.so.12, the timing simulator (cudasim.c, soname
# libcudart.so.12; NOT CUDA), and DIR/libfakekernels.so (kernels.c). Rebuilds
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
        gcc -O2 -g -Wall -shared -fPIC "$@" -o "$dir/.$out.$$" "$here/$src" -lpthread
        mv "$dir/.$out.$$" "$dir/$out"
    fi
}
build libcudart.so.12 cudasim.c -Wl,-soname,libcudart.so.12
build libfakekernels.so kernels.c
echo "$dir"
