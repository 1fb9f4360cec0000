"""The perf mmap ring buffer: one metadata page followed by 2^n data pages.

The kernel advances data_head as it writes; we copy [tail, head) out in one
or two slices (one if it does not wrap), then publish data_tail so the
kernel may reuse the space. Records never straddle `head`, so a chunk always
holds whole records. x86 does not reorder loads with loads, so reading
data_head before the data needs no explicit barrier here."""
from __future__ import annotations

import mmap
import struct

from .shared_word import SharedWord

PAGE = mmap.PAGESIZE
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_HEAD, _TAIL, _DATA_OFFSET, _DATA_SIZE = 1024, 1032, 1040, 1048


class RingBuffer:
    def __init__(self, fd: int, data_pages: int):
        if data_pages & (data_pages - 1):
            raise ValueError("ring buffer pages must be a power of two")
        self.fd = fd
        self.map = mmap.mmap(fd, PAGE * (1 + data_pages), mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
        self.offset = _U64.unpack_from(self.map, _DATA_OFFSET)[0] or PAGE
        self.size = _U64.unpack_from(self.map, _DATA_SIZE)[0] or PAGE * data_pages
        self._head = SharedWord(self.map, _HEAD)
        self._tail = SharedWord(self.map, _TAIL)
        self.tail = self._tail.load()

    def read(self, most: int = 1 << 62) -> bytes:
        """What was written since the last read, as one bytes object: all
        of it, or whole records up to about `most` bytes (the rest stays
        for the next read: a reader behind holds less in memory)."""
        head = self._head.load()
        tail = self.tail
        if head == tail:
            return b""
        if head - tail > most:
            head = self._records_end(tail, head, most)
        size, base = self.size, self.offset
        start, end = tail % size, head % size
        if start < end:
            chunk = self.map[base + start:base + end]
        else:
            chunk = self.map[base + start:base + size] + self.map[base:base + end]
        self.tail = head
        self._tail.store(head)
        return chunk

    def _records_end(self, tail: int, head: int, most: int) -> int:
        """Where the records from `tail` end, for at most `most` bytes (at
        least one record). A header is 8-byte aligned: it never wraps."""
        size, base = self.size, self.offset
        at = tail
        while at < head:
            length = _U16.unpack_from(self.map, base + (at + 6) % size)[0]
            if length == 0 or (at + length - tail > most and at > tail):
                break
            at += length
        return min(at, head) if at > tail else head

    def close(self) -> None:
        self._head.release()
        self._tail.release()
        try:
            self.map.close()
        except (BufferError, ValueError):
            pass
