"""Print the first bytes of this interpreter's `_PyRuntime` (where CPython
3.13+ keeps its `_Py_DebugOffsets`) as hex, one line: test data for
tracer-user/src/python/debug_offsets.rs.

    chroot ROOT python3.14 - < scripts/capture-debug-offsets.py > debug_offsets_3.14.hex

The structure is 760 bytes on 3.14 and 888 on 3.15; 1024 are captured (the
rest is runtime state, unused by the tests)."""
import ctypes
import sys

LEN = 1024
addr = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
blob = ctypes.string_at(addr, LEN)
assert blob[:8] == b"xdebugpy", f"{sys.version}: _PyRuntime does not start with _Py_DebugOffsets"
print(f"# {sys.version.split()[0]} ({sys.executable}), {LEN} bytes from _PyRuntime")
print(blob.hex())
