"""A C library through ctypes, its functions declared: the one way kernel/
binds libelf, libdw and libdeflate."""
from __future__ import annotations

import ctypes


def bind(soname: str | None, signatures) -> ctypes.CDLL | None:
    """The library `soname` (None: the C library this process runs on)
    with each (name, restype, argtypes) of `signatures` declared; None when
    it is not installed or lacks one of them (an older version), so callers
    fall back as without it."""
    try:
        lib = ctypes.CDLL(soname)
        for name, restype, argtypes in signatures:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError):
        return None
    return lib
