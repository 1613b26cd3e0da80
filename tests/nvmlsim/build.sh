#!/bin/sh
# Builds the NVML test stand-in into DIR (default: target/nvmlsim under the
# workspace): DIR/libnvidia-ml.so.1 (nvmlsim.c, soname libnvidia-ml.so.1; NOT
# NVML: fixed values for two fake GPUs), and two variants missing functions:
# DIR/old/libnvidia-ml.so.1 (-DNVMLSIM_OLD) and DIR/broken/libnvidia-ml.so.1
# (-DNVMLSIM_BROKEN). Rebuilds only what is older than its source. Prints
# DIR. Needs gcc.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/../../target/nvmlsim}
mkdir -p "$dir/old" "$dir/broken"
dir=$(cd "$dir" && pwd)
build() { # out extra...
    out=$1
    shift
    if [ ! -e "$dir/$out" ] || [ "$here/nvmlsim.c" -nt "$dir/$out" ]; then
        gcc -O2 -g -Wall -Werror -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 "$@" \
            -o "$dir/$out.$$.tmp" "$here/nvmlsim.c"
        mv "$dir/$out.$$.tmp" "$dir/$out"
    fi
}
build libnvidia-ml.so.1
build old/libnvidia-ml.so.1 -DNVMLSIM_OLD
build broken/libnvidia-ml.so.1 -DNVMLSIM_BROKEN
echo "$dir"
