"""Names of Go code from .gopclntab: functions (stripped binaries too),
and with --lines/--inlines file:line and the calls inlined at a pc."""
from __future__ import annotations

from collections.abc import Callable

from ..model import Frame, Mapping, printable
from ..objfile.elf import ElfImage


class GoSymbols:
    """`image` opens an object by path (None: unreadable), shared with the
    ELF source so that each file is opened once."""

    def __init__(self, options, image: Callable[[str], ElfImage | None]):
        self.options = options
        self._image = image

    def table(self, path: str):
        """The pclntab of the Go object at path; None for other objects."""
        image = self._image(path)
        if image is None or not image.is_go:
            return None
        from ..objfile.gopclntab import PclntabError, go_table     # Go's only
        try:
            return go_table(image)
        except PclntabError:
            return None                 # corrupt: ELF symbols only, no wrong names

    def frames(self, go, m: Mapping, module: str, addr: int, vaddr: int,
               back: int) -> list:
        func = go.find(vaddr)
        if func is None:
            return [Frame(addr=addr, module=module, path=m.path)]
        lines, inlines = self.options.lines, self.options.inlines
        # the last GoFrame is func itself, at the call site of what was
        # inlined into it: its file:line lies inside the function it names
        found = go.frames(vaddr) if (lines or inlines) else []
        out = [Frame(addr=addr, module=module, function=printable(g.function), path=m.path,
                     file=g.file if lines else "", line=g.line if lines else 0,
                     inlined=True)
               for g in (found[:-1] if inlines else ())]
        own = found[-1] if lines and found else None
        out.append(Frame(addr=addr, module=module, function=printable(func.name),
                         offset=vaddr + back - func.entry, size=func.end - func.entry,
                         path=m.path, file=own.file if own else "",
                         line=own.line if own else 0))
        return out
