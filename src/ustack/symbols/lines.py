"""--lines and --inlines: a named frame plus its DWARF source locations
becomes the frames a user reads, the way `eu-addr2line -i` lists them:
each inlined call first (innermost first, all at the frame's address,
marked inlined), then the real function at the line of the outermost
inlined call."""
from __future__ import annotations

from dataclasses import replace

from ..model import Frame


def expand(frame: Frame, locs: tuple, lines: bool, inlines: bool) -> list:
    """`locs`: SourceLocs at the frame's address, innermost first (see
    objfile.dwarf_lines). Without --inlines the frame keeps its own
    function's line: the call site of what was inlined into it, so that
    name and line agree."""
    if not locs:
        return [frame]
    outer = locs[-1]
    real = replace(frame, file=outer.file, line=outer.line) if lines else frame
    if not inlines:
        return [real]
    inlined = [Frame(addr=frame.addr, module=frame.module, function=loc.function or None,
                     path=frame.path, inlined=True,
                     file=loc.file if lines else "", line=loc.line if lines else 0)
               for loc in locs[:-1]]
    return inlined + [real]
