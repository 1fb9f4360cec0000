"""Pages of the ftrace ring buffer as per_cpu/cpuN/trace_pipe_raw hands them
out (events/header_page, events/header_event; kernel/trace/ring_buffer.c):

  page:  u64 timestamp | u64 commit (bytes of data; high bits are flags) | data
  event: u32 type_len:5, time_delta:27 | body
         type_len 1..28: body is type_len*4 bytes of record
         type_len 0:     u32 length (+4), then the record
         29: padding (length in the next u32; delta 0: rest of the page)
         30: time extend (delta += next u32 << 27); 31: absolute time stamp

Records are the event's fields as its `format` file lays them out."""
from __future__ import annotations

import struct

COMMIT_MASK = (1 << 27) - 1
_PAGE_HEAD = struct.Struct("<QQ")
_U32 = struct.Struct("<I")
PADDING, TIME_EXTEND, TIME_STAMP = 29, 30, 31


def page_time(page, start: int = 0) -> int:
    """The timestamp a page's records count from: none of them is older."""
    return _PAGE_HEAD.unpack_from(page, start)[0]


def records(page, start: int = 0):
    """Yield (timestamp ns, offset, length) of every record in a page read
    from trace_pipe_raw (`page[start:]`)."""
    ts, commit = _PAGE_HEAD.unpack_from(page, start)
    pos = start + 16
    end = min(pos + (commit & COMMIT_MASK), len(page))
    u32 = _U32.unpack_from
    while pos + 4 <= end:
        head = u32(page, pos)[0]
        type_len, delta = head & 31, head >> 5
        if type_len == PADDING:
            if delta == 0:
                return                       # the rest of the page is empty
            pos += 4 + u32(page, pos + 4)[0]
        elif type_len == TIME_EXTEND:
            ts += delta + (u32(page, pos + 4)[0] << 27)
            pos += 8
        elif type_len == TIME_STAMP:
            ts = delta | (u32(page, pos + 4)[0] << 27)
            pos += 8
        elif type_len == 0:
            ts += delta
            length = u32(page, pos + 4)[0] - 4
            yield ts, pos + 8, length
            pos += 8 + length
        else:
            ts += delta
            yield ts, pos + 4, type_len * 4
            pos += 4 + type_len * 4
