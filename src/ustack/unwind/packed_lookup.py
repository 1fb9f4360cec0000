"""The in-kernel walk's rows (tables.PackedRows) asked as the user-space
unwinder asks a CFI table (cfi.UnwindTable.lookup): one row source for
both walks, so a stack deferred to user space is unwound as the kernel
would have unwound it. A Go binary has rows only here (from .gopclntab:
it has no .eh_frame for most functions), with the mark of the frames
that run on another stack (tables.STACK_SWITCH), which the unwinder
follows onto the copy of that stack.

lookup() answers (kind, cfa_off, ra_off, bp_rule, bp_off, aux, bx_rule,
bx_off) in cfi.py's kinds; a switching frame is a CFA_BP row whose aux is
STACK_SWITCH (cfi.py's CFA_BP rows carry no aux). A signal trampoline's
row answers None: the unwinder checks the bytes there itself, as for an
object without rows."""
from __future__ import annotations

from . import cfi, tables

_KINDS = {tables.SP: cfi.CFA_SP, tables.BP: cfi.CFA_BP, tables.PLT: cfi.CFA_PLT,
          tables.END: cfi.END, tables.BX: cfi.CFA_BX, tables.SP_DEREF: cfi.CFA_SP_DEREF,
          tables.BP_DEREF: cfi.CFA_BP_DEREF, tables.UNSUPPORTED: cfi.UNKNOWN}


class PackedLookup:
    """lookup() over one object's packed rows, through their page index."""

    __slots__ = ("rows", "pages")

    def __init__(self, rows: tables.PackedRows):
        self.rows = rows
        self.pages = rows.pages()

    def __len__(self) -> int:
        return len(self.rows)

    def lookup(self, vaddr: int) -> tuple | None:
        row = self.rows.lookup(vaddr, self.pages)
        if row is None:
            return None
        kind, bp_rule, bx_rule, aux, cfa, bp, bx = row
        ours = _KINDS.get(kind)
        if ours is None:                # a gap, or a sigreturn trampoline
            return None
        return (ours, cfa, -8, bp_rule, bp, aux, bx_rule, bx)


# object (its ElfImage: one per file version) -> its PackedLookup: each
# process's mapping of an object asks again, and reading its rows and
# indexing their pages costs ~1 ms for libc, ~11 ms for node, 30-44 ms for
# libLLVM. Rows not built yet are not kept: they may be by the next ask.
_FOUND: dict = {}
MAX_FOUND = 32


def for_unwinder(image, debug_dirs=()) -> PackedLookup | None:
    """The packed rows of an object for the user-space unwinder: a Go
    binary's always (built now if no other thread or run built them: its
    frames have no CFI to fall back on); another object's when its rows
    are built already (the in-kernel walk loaded them, or the cache holds
    them), else None: its CFI table answers instead, without waiting for
    a build."""
    found = _FOUND.get(image)
    if found is not None:
        return found
    packed = tables.for_image(image, debug_dirs, run_waits=True,
                              cached_only=not image.file.is_go)
    if packed is None or packed is tables.NOT_CACHED:
        return None
    if len(_FOUND) >= MAX_FOUND:
        _FOUND.clear()
    found = _FOUND[image] = PackedLookup(packed)
    return found
