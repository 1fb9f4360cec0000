"""zlib streams inflated by libdeflate (libdeflate.so.0, Debian's
libdeflate0), called with ctypes, straight into memory the caller owns:
~3× faster than zlib on libc's 5.8 MB .debug_info (8 ms against 23 ms),
no copy, and other threads run meanwhile (ctypes lets go of the GIL).
objfile.dwarf_image fills libdw's image with it.

Without libdeflate.so.0, available() is False and callers use zlib."""
from __future__ import annotations

import ctypes

from . import clib

_SUCCESS = 0
_RESULTS = {1: "bad data", 2: "shorter than its header says", 3: "longer than its header says"}

_lib = None            # the loaded libdeflate, False when it cannot be had


def _load():
    global _lib
    if _lib is None:
        P, size = ctypes.c_void_p, ctypes.c_size_t
        _lib = clib.bind("libdeflate.so.0", (
            ("libdeflate_alloc_decompressor", P, []),
            ("libdeflate_free_decompressor", None, [P]),
            ("libdeflate_zlib_decompress", ctypes.c_int,
             [P, P, size, P, size, ctypes.POINTER(size)]))) or False
    return _lib


def available() -> bool:
    return bool(_load())


class DeflateError(Exception):
    """The stream is corrupt, or not of the size expected."""


def zlib_inflate_into(data: bytes, start: int, buffer, offset: int, size: int) -> None:
    """Inflate the zlib stream at data[start:] into buffer[offset:offset +
    size] (a writable buffer: mmap, bytearray); it must fill them exactly.
    Threads may call it at once."""
    lib = _load()
    if not lib:
        raise DeflateError("libdeflate.so.0 is not installed")
    view = (ctypes.c_char * size).from_buffer(buffer, offset)   # held through the call
    out = ctypes.addressof(view)
    decompressor = lib.libdeflate_alloc_decompressor()   # one per call: not shareable
    if not decompressor:
        raise MemoryError("libdeflate_alloc_decompressor")
    try:
        got = ctypes.c_size_t()
        stream = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value + start
        result = lib.libdeflate_zlib_decompress(decompressor, stream, len(data) - start,
                                                out, size, ctypes.byref(got))
    finally:
        lib.libdeflate_free_decompressor(decompressor)
    if result != _SUCCESS or got.value != size:
        raise DeflateError(_RESULTS.get(result, f"libdeflate error {result}")
                           if result != _SUCCESS else "shorter than its header says")
