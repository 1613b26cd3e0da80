#!/usr/bin/env python3
"""Regenerates tracer-user/src/syscalls/names_table.rs from the UAPI headers
(linux-libc-dev): x86_64 asm/unistd_64.h and asm-generic/unistd.h (aarch64)."""
import re, sys

def parse(path):
    table = {}
    for line in open(path):
        m = re.match(r'#define\s+__NR(3264)?_(\w+)\s+(\d+)\s*$', line)
        if not m:
            continue
        name, nr = m.group(2), int(m.group(3))
        if m.group(1):
            name = {'fstatat': 'newfstatat'}.get(name, name)
        if name == 'syscalls' or name.startswith('arch_specific'):
            continue
        table.setdefault(nr, name)
    return table

def emit(const, table):
    top = max(table)
    out = f"/// Generated from the kernel UAPI headers by scripts/gen-syscall-names.py.\npub static {const}: [&str; {top + 1}] = [\n"
    out += "".join(f'    "{table.get(i, "")}",\n' for i in range(top + 1))
    return out + "];\n"

x86 = parse('/usr/include/x86_64-linux-gnu/asm/unistd_64.h')
arm = parse('/usr/include/asm-generic/unistd.h')
dest = sys.argv[1] if len(sys.argv) > 1 else 'tracer-user/src/syscalls/names_table.rs'
with open(dest, 'w') as f:
    f.write("//! Syscall number -> name tables (empty string: unassigned).\n\n")
    f.write(emit("X86_64", x86) + "\n" + emit("AARCH64", arm))
