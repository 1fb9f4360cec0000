"""The in-kernel unwinder's row table in chunks (capture/row_chunks.py):
a chunk is an eighth of the bound (a power of two, 4 MiB at most), the
table grows a chunk at a time up to its bound, and rows written across a
chunk's edge land in both chunks, in order."""
from __future__ import annotations

import struct

import pytest

from ustack.capture.bpf_common import unwind_object
from ustack.capture.row_chunks import MAX_CHUNK_SHIFT, ROW_SIZE, RowChunks, chunk_shift


def test_a_chunk_is_an_eighth_of_the_bound_at_most_4_mib():
    assert 1 << chunk_shift(1 << 20) == 1 << 17          # 16 MiB: 2 MiB chunks
    assert 1 << chunk_shift(100_000) == 8192             # 12,500 rounded down
    assert chunk_shift((256 << 20) // ROW_SIZE) == MAX_CHUNK_SHIFT
    assert (1 << MAX_CHUNK_SHIFT) * ROW_SIZE == 4 << 20


@pytest.mark.kernel
def test_the_table_grows_to_its_bound_and_rows_cross_chunks():
    table = RowChunks(unwind_object(), 70)               # chunks of 8 rows
    try:
        assert (table.chunk_rows, table.rows) == (8, 8)
        grown = [table.grow() for _ in range(10)]
        # nine chunks hold 72 rows: the last gives 6 of its 8, then none
        assert grown == [8] * 7 + [6, 0, 0] and table.rows == 70
        assert len(table.chunks) == 9 and table.made_bytes == 72 * ROW_SIZE
        rows = b"".join(struct.pack("<I", 1000 + i).ljust(ROW_SIZE, b"\0") for i in range(20))
        table.write_values(5 * ROW_SIZE, rows)          # rows 5-24: chunks 0 to 3
        for i in range(30):
            chunk, at = divmod(i, 8)
            got = table.chunks[chunk].lookup(struct.pack("<I", at))
            want = rows[(i - 5) * ROW_SIZE:(i - 4) * ROW_SIZE] if 5 <= i < 25 \
                else bytes(ROW_SIZE)
            assert got == want, i
        # the outer map has a slot for each chunk the bound needs
        assert table.outer.max_entries == 9
    finally:
        table.close()
