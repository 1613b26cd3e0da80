#!/usr/bin/env python3
"""Regenerates tracer-user/src/system/syscall_names.rs from the UAPI headers
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

# Newer than the UAPI headers of the build machine (Linux 6.5-6.17): numbers
# shared by x86_64 and asm-generic, plus x86_64's uretprobe (6.11).
NEWER = ["cachestat", "fchmodat2", "map_shadow_stack", "futex_wake", "futex_wait",
         "futex_requeue", "statmount", "listmount", "lsm_get_self_attr",
         "lsm_set_self_attr", "lsm_list_modules", "mseal", "setxattrat", "getxattrat",
         "listxattrat", "removexattrat", "open_tree_attr", "file_getattr", "file_setattr"]

def add_newer(table, extra=None):
    for i, name in enumerate(NEWER):
        table.setdefault(451 + i, name)
    for nr, name in (extra or {}).items():
        table.setdefault(nr, name)
    return table

def emit(const, table):
    top = max(table)
    out = ("/// Generated from the kernel UAPI headers by scripts/gen-syscall-names.py;\n"
           "/// 451-469 (Linux 6.5-6.17) and x86_64's 335 (`uretprobe`, 6.11) added by\n"
           "/// hand from the kernel's syscall tables.\n"
           f"pub static {const}: [&str; {top + 1}] = [\n")
    out += "".join(f'    "{table.get(i, "")}",\n' for i in range(top + 1))
    return out + "];\n"

x86 = add_newer(parse('/usr/include/x86_64-linux-gnu/asm/unistd_64.h'), {335: 'uretprobe'})
arm = add_newer(parse('/usr/include/asm-generic/unistd.h'))
dest = sys.argv[1] if len(sys.argv) > 1 else 'tracer-user/src/system/syscall_names.rs'
with open(dest, 'w') as f:
    f.write("//! Syscall number -> name tables (empty string: unassigned).\n\n")
    f.write(emit("X86_64", x86) + "\n" + emit("AARCH64", arm))
