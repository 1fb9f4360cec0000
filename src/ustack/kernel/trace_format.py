"""ftrace event `format` files: where each field of an event's binary record
is, and the fetch-arg values of a uprobe record (report.fetchargs shows
them as text).

The same record bytes reach ustack two ways: PERF_SAMPLE_RAW (perf backend)
and the ftrace ring buffer (tracefs backend); both start with the common
fields (common_type u16, flags u8, preempt_count u8, common_pid s32)."""
from __future__ import annotations

import re
import struct
from ..values import value

# compiled at first use (re's cache): a run that reads no format file
# (a BPF run's tracepoints) compiles nothing at import
_FIELD = (r"field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*"
          r"size:(?P<size>\d+);\s*signed:(?P<signed>\d+);")


@value
class Field:
    name: str
    offset: int
    size: int
    signed: bool
    data_loc: bool                 # __data_loc: u32 (len << 16 | offset)
    count: int                     # array elements (1 for a scalar)


def parse_format(text: str) -> dict:
    """name -> Field for every field of a format file."""
    fields = {}
    for m in re.finditer(_FIELD, text):
        decl = m["decl"].strip()
        data_loc = decl.startswith("__data_loc")
        arr = re.search(r"\[(\d*)\]$", decl)
        if arr:
            decl = decl[:arr.start()]
        words = decl.split()
        name = words[-1].lstrip("*")
        size = int(m["size"])
        count = 1
        if arr and not data_loc:
            if arr.group(1):
                count = int(arr.group(1))
            else:                        # 'u64 arg4[]': size / element size
                count = max(size // _elem_size(" ".join(words[:-1]), size), 1)
        fields[name] = Field(name, int(m["off"]), size, m["signed"] == "1",
                             data_loc, count)
    return fields


def _elem_size(ctype: str, size: int) -> int:
    m = re.search(r"(\d+)$", ctype)         # u8 … s64
    if m:
        return int(m.group(1)) // 8
    for word, n in (("char", 1), ("short", 2), ("long", 8), ("int", 4)):
        if word in ctype:
            return n
    return size


def event_id(text: str) -> int:
    m = re.search(r"^ID:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else -1


_INT = {(1, False): "B", (2, False): "H", (4, False): "I", (8, False): "Q",
        (1, True): "b", (2, True): "h", (4, True): "i", (8, True): "q"}


class ArgsDecoder:
    """Decodes the fetch-args of one uprobe event's record: decode() gives
    the raw values, report.fetchargs.format_args shows them as the kernel's
    print fmt does. `kinds` maps each arg name to how it is shown (hex, u/s
    decimal, char, string); hex values are read unsigned."""

    def __init__(self, fields: dict, kinds: dict):
        self.items = []
        for name, kind in kinds.items():
            f = fields.get(name)
            if f is None:
                continue
            if f.data_loc:
                self.items.append((name, kind, f.offset, None))
                continue
            elem = f.size // f.count
            fmt = struct.Struct("<" + str(f.count) +
                                _INT.get((elem, f.signed and kind != "hex"), "Q"))
            self.items.append((name, kind, f.offset, fmt))

    def decode(self, data) -> tuple:
        """(name, kind, value) per arg, in order. value: an int; a tuple of
        ints for an array; bytes up to the first NUL for a string; None
        when the record is too short to hold it."""
        out = []
        for name, kind, off, fmt in self.items:
            try:
                if fmt is None:
                    loc = struct.unpack_from("<I", data, off)[0]
                    start, length = loc & 0xFFFF, loc >> 16
                    value = bytes(data[start:start + length]).split(b"\0", 1)[0]
                else:
                    vals = fmt.unpack_from(data, off)
                    value = vals[0] if len(vals) == 1 else vals
            except struct.error:
                value = None
            out.append((name, kind, value))
        return tuple(out)
