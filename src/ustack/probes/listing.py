"""`ustack list BINARY [PATTERN]`: the functions a uprobe can be put on."""
from __future__ import annotations

from typing import NamedTuple, Optional

from ustack.probes.resolve import locate_binary, no_function_error
from ustack.objfile.demangle import demangle
from ustack.objfile.elf import ElfImage


class FunctionRow(NamedTuple):
    name: str
    address: int
    file_offset: Optional[int]
    size: int


def list_functions(path: str, glob: Optional[str] = None) -> list:
    host, shown = locate_binary(path)
    image = ElfImage.open(host)
    syms = image.functions if glob is None else image.match(glob)
    if glob is not None and not syms:
        raise no_function_error(image, glob, shown)
    return [FunctionRow(demangle(s.name), s.address, image.file_offset(s.address), s.size)
            for s in syms]


def format_listing(rows) -> str:
    header = ("ADDRESS", "OFFSET", "SIZE")
    cells = [(f"{r.address:x}", "-" if r.file_offset is None else f"{r.file_offset:x}",
              f"{r.size:x}") for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]

    def line(nums, name):
        return "  ".join(n.rjust(w) for n, w in zip(nums, widths)) + "  " + name

    return "\n".join([line(header, "FUNCTION")]
                     + [line(c, r.name) for c, r in zip(cells, rows)]) + "\n"
