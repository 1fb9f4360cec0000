"""A u64 in memory shared with the kernel (a ring buffer's head and tail
positions), read and written whole.

struct's pack_into zeroes the field and then writes it a byte at a time, and
unpack_from reads it a byte at a time. The kernel, on another CPU, then may
see a consumer position of 0 or half written (a ring it takes for full: the
event is lost), and we may read a head half old and half new (records that
are not there). A memoryview of native 'Q' items loads and stores the eight
bytes in one instruction."""
from __future__ import annotations


class SharedWord:
    """The aligned u64 at `offset` of `mapping` (an mmap). release() before
    the mapping is closed: an mmap with a view on it cannot close."""

    def __init__(self, mapping, offset: int):
        if offset % 8:
            raise ValueError("a shared word must be 8-byte aligned")
        self._view = memoryview(mapping)[offset:offset + 8].cast("Q")

    def load(self) -> int:
        return self._view[0]

    def store(self, value: int) -> None:
        self._view[0] = value

    def release(self) -> None:
        self._view.release()
