"""libstdc++'s __cxa_demangle (the C++ ABI's demangler, what c++filt
uses), opened by its soname: the dynamic linker finds it. The cxxfilt
package found it and the C library through ctypes.util.find_library on
import, which runs `ldconfig -p` once for each (~10 ms a run)."""
from __future__ import annotations

import ctypes

from .clib import bind

LIBSTDCXX = "libstdc++.so.6"
_demangler = None               # (__cxa_demangle, free); False: no libstdc++


def _bound():
    global _demangler
    if _demangler is None:
        cxx = bind(LIBSTDCXX, [("__cxa_demangle", ctypes.c_void_p,
                                [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_int)])])
        libc = bind(None, [("free", None, [ctypes.c_void_p])])
        _demangler = (cxx.__cxa_demangle, libc.free) if cxx and libc else False
    return _demangler


def cxa_demangle(mangled: bytes) -> bytes | None:
    """The demangled name, or None when it is not a valid mangled name
    (or libstdc++ is not installed)."""
    bound = _bound()
    if not bound:
        return None
    demangle, free = bound
    status = ctypes.c_int(0)
    out = demangle(mangled, None, None, ctypes.byref(status))
    if not out:
        return None
    try:
        return ctypes.string_at(out) if status.value == 0 else None
    finally:
        free(out)
