"""Asking this process's dynamic linker (through ctypes, so it lives in the
layer that holds every foreign call): the address a symbol of an already
loaded library resolves to here."""
from __future__ import annotations

import ctypes
import os


def resolved_address(path: str, name: str) -> int | None:
    """dlsym(name) in the library at `path` if this process has it loaded
    (RTLD_NOLOAD: nothing is loaded, no constructor runs); for an IFUNC,
    what its resolver returns. None when not loaded or not found."""
    try:
        library = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return ctypes.cast(getattr(library, name), ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None
