"""The in-kernel unwinder's row table (ROWS, unwind.h) as chunks made as
the run needs them, up to a bound: a whole machine's run used to reserve
its whole table at the start (~120 MiB with clang, chromium, node and java
running, most of it never loaded), and a small program's run 16 MiB for
~40 k rows.

Each chunk is an ARRAY map of `chunk_rows` rows (a power of two, the same
for every chunk: the outer map's inner maps must match its template),
made mmapable so rows are written by a copy (unwind.h's
row_chunks_inner); ROW_CHUNKS (an array of maps) holds their fds. Row i
is row i % chunk_rows of chunk i // chunk_rows: an object's rows may
cross from one chunk into the next. The programs read the chunk size
from .rodata (rodata())."""
from __future__ import annotations

import struct

from ..kernel import bpf_syscall
from ..unwind import tables

ROW_SIZE = tables.ROW.size       # struct unwind_row
# A chunk is an eighth of the bound, rounded down to a power of two, 4 MiB
# at most: made in 0.34 ms (16 MiB: 1.6 ms) when an object finds no room;
# a small target's 16 MiB bound makes 2 MiB for its ~40 k rows; a grown
# table passes its bound by at most one chunk's unused tail.
MAX_CHUNK_SHIFT = 18
MIN_CHUNK_SHIFT = 1
CHUNKS_PER_BOUND = 8
_U32 = struct.Struct("<I")


def chunk_shift(bound: int) -> int:
    """log2 of the chunk size of a table of at most `bound` rows."""
    return max(MIN_CHUNK_SHIFT,
               min(MAX_CHUNK_SHIFT, (max(1, bound // CHUNKS_PER_BOUND)).bit_length() - 1))


class RowChunks:
    """The table of a run: `outer` (ROW_CHUNKS) and the chunks made so
    far, at least one; `bound`: the most rows it may hold, `rows`: how many
    it holds now (never more than `bound`). `obj`: the unwinder's
    BpfObject (its ROW_CHUNKS declaration)."""

    def __init__(self, obj, bound: int):
        self.bound = max(1, bound)
        self.shift = chunk_shift(self.bound)
        self.chunk_rows = 1 << self.shift
        self.chunks: list = []
        self.outer = None
        self._obj = obj
        # the first chunk is the template of the outer map's inner maps
        first = self._new_chunk()
        try:
            slots = -(-self.bound // self.chunk_rows)
            self.outer = obj.make_map("row_chunks", slots, inner_map_fd=first.fd)
            self._insert(first)
        except BaseException:
            first.close()
            self.close()
            raise

    def _new_chunk(self) -> bpf_syscall.Map:
        return self._obj.make_map("row_chunks_inner", self.chunk_rows)

    def _insert(self, chunk: bpf_syscall.Map) -> None:
        self.outer.update(_U32.pack(len(self.chunks)), _U32.pack(chunk.fd))
        self.chunks.append(chunk)

    @property
    def rows(self) -> int:
        """Rows the table holds now: those of its chunks, within the bound."""
        return min(self.bound, len(self.chunks) * self.chunk_rows)

    @property
    def made_bytes(self) -> int:
        """Bytes of rows the chunks made so far hold (the last may reach
        past the bound)."""
        return len(self.chunks) * self.chunk_rows * ROW_SIZE

    def grow(self) -> int:
        """One more chunk; the rows the table gained (0: at its bound, or
        the kernel would not make one)."""
        before = self.rows
        if before >= self.bound:
            return 0
        try:
            chunk = self._new_chunk()
        except Exception:                # out of memory or memlock: as at the bound
            return 0
        try:
            self._insert(chunk)
        except OSError:
            chunk.close()
            return 0
        return self.rows - before

    def write_values(self, at: int, data: bytes) -> None:
        """`data` at byte `at` of the table, split at the chunks' edges
        (each chunk's write maps only the pages it writes)."""
        size = self.chunk_rows * ROW_SIZE
        done = 0
        while done < len(data):
            index, offset = divmod(at + done, size)
            part = data[done:done + size - offset]
            self.chunks[index].write_values(offset, part)
            done += len(part)

    def rodata(self) -> dict:
        """The .rodata values of a program that reads the table."""
        return {"row_chunk_shift": self.shift}

    def close(self) -> None:
        """The maps closed; their sizes stay for the closing note."""
        for m in [self.outer, *self.chunks]:
            if m is not None:
                m.close()
