"""One scope at an address, as the line sources (objfile.dwarf_lines) give
it: the common answer of the SymCache, libdw and pyelftools readers."""
from __future__ import annotations

from collections import namedtuple


class SourceLoc(namedtuple("SourceLoc", "function file line")):
    """A function (a real or an inlined one) and where in its source the
    address is — for an enclosing scope, the line that made the inlined
    call: `function` is the linkage name when DWARF has one, else
    DW_AT_name ('' unknown), then `file` and `line`. A tuple: made for
    every frame, so cheap to make (collections', not typing's: importing
    typing cost ~4 ms of every run that names frames)."""
    __slots__ = ()
