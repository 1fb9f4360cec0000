"""One scope at an address, as the line sources (objfile.dwarf_lines) give
it: the common answer of the SymCache, libdw and pyelftools readers."""
from __future__ import annotations

from typing import NamedTuple


class SourceLoc(NamedTuple):
    """A function (a real or an inlined one) and where in its source the
    address is — for an enclosing scope, the line that made the inlined
    call. A tuple: made for every frame, so cheap to make."""
    function: str      # linkage name when DWARF has one, else DW_AT_name; '' unknown
    file: str
    line: int
