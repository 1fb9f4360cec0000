"""--lines and --inlines: a named frame plus its DWARF source locations
becomes the frames a user reads, the way `eu-addr2line -i` lists them:
each inlined call first (innermost first, all at the frame's address,
marked inlined), then the real function at the line of the outermost
inlined call."""
from __future__ import annotations

from collections.abc import Callable

from ..model import Frame, printable


def real_line(locs: tuple, lines: bool) -> tuple:
    """(file, line) the real function's frame shows. `locs`: SourceLocs at
    the frame's address, innermost first (see objfile.dwarf_lines). The
    frame keeps its own function's line: the call site of what was inlined
    into it, so that name and line agree."""
    if not (lines and locs):
        return "", 0
    return locs[-1].file, locs[-1].line


def inlined_frames(frame: Frame, locs: tuple, lines: bool, name: Callable[[str], str]) -> list:
    """The frames of the calls inlined at `frame`'s address (--inlines),
    innermost first; `name` turns DWARF's linkage names into the ones shown."""
    return [Frame(addr=frame.addr, module=frame.module,
                  function=name(loc.function) if loc.function else None,
                  path=frame.path, inlined=True,
                  file=printable(loc.file) if lines else "", line=loc.line if lines else 0)
            for loc in locs[:-1]]
