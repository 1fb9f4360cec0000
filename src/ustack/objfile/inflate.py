"""zlib streams of compressed ELF sections (SHF_COMPRESSED), inflated by
libdeflate (the `deflate` package) when it is installed: ~3× faster than
zlib on libc's 5.8 MB .debug_info (8 ms against 23 ms) and, like zlib, it
lets other threads run meanwhile (objfile.dwarf_image inflates two
sections at a time). zlib answers without it, and for sizes libdeflate
would have to trust blindly."""
from __future__ import annotations

import zlib

# the deflate module once looked for (imported on first use: most runs
# inflate nothing); None when it is not installed (tests set None too)
LIBDEFLATE = ...
# deflate never shrinks data more than 1032:1: a larger claimed size is a
# corrupt header, and libdeflate would allocate all of it up front
_MAX_RATIO = 1032


class InflateError(Exception):
    """The stream is corrupt."""


def inflate(stream, size: int) -> bytes:
    """The `size` bytes a zlib `stream` (bytes or memoryview) holds; fewer
    when it ends before."""
    fast = _libdeflate()
    if fast is not None and size <= _MAX_RATIO * len(stream) + 64:
        try:
            return fast.zlib_decompress(stream, size)
        except fast.DeflateError:
            pass                # zlib says what is wrong, or reads a short stream
    try:
        return zlib.decompressobj().decompress(stream, size)
    except zlib.error as e:
        raise InflateError(str(e)) from None


def _libdeflate():
    global LIBDEFLATE
    if LIBDEFLATE is ...:
        try:
            import deflate
        except ImportError:     # an optional speed-up: zlib does the same job
            deflate = None
        LIBDEFLATE = deflate
    return LIBDEFLATE
