"""The rows packed for the in-kernel unwinder say what cfi.py's table says,
at every address sampled: row starts, the byte before each, and a spread of
addresses in between; the signal trampoline gets its own row."""
from __future__ import annotations

import random

import pytest

from helpers import O2_NOFP, build
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables
from ustack.unwind.cfi import UnwindTable
from ustack.unwind.dwarf import RESTORE_RT

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _expected(table: UnwindTable, vaddr: int) -> tuple:
    row = table.lookup(vaddr)
    if row is None:
        return tables.NO_ROW
    return tables.pack_row(*row)


def _sample_pcs(table: UnwindTable) -> list:
    pcs = set()
    for s in table.starts:
        pcs.update((s, s - 1, s + 1))
    rnd = random.Random(10)
    lo, hi = table.starts[0], table.starts[-1]
    pcs.update(rnd.randrange(lo, hi) for _ in range(20000))
    return sorted(p for p in pcs if p >= lo)


@pytest.mark.parametrize("which", ["libc", "chain-o2-nofp"])
def test_rows_agree_with_cfi(which):
    path = LIBC if which == "libc" else str(build("chain", flags=O2_NOFP))
    image = ElfImage.open(path)
    table, _ = UnwindTable.for_image(image)
    packed = tables.for_image(image)
    assert packed is not None and len(packed) > 0
    # the trampoline's rows, and the byte after its syscall (padding)
    signal = [(at - 1, at + len(RESTORE_RT) + 1) for at in tables.signal_trampolines(image)]
    checked = 0
    for pc in _sample_pcs(table):
        if any(lo <= pc < hi for lo, hi in signal):
            continue
        got = packed.lookup(pc)
        assert (got or tables.NO_ROW) == _expected(table, pc), hex(pc)
        checked += 1
    assert checked > 500
    print(f"{which}: {len(table)} CFI rows -> {len(packed)} packed, "
          f"{len(packed.data)} bytes")


def test_libc_signal_trampoline_row():
    image = ElfImage.open(LIBC)
    packed = tables.for_image(image)
    (at,) = tables.signal_trampolines(image)
    assert image.read(at, len(RESTORE_RT)) == RESTORE_RT
    # from the byte before (a return address is looked up at pc - 1) to the
    # pc just after its syscall (exact: the rt_sigreturn event)
    for pc in (at - 1, at, at + len(RESTORE_RT) - 1, at + len(RESTORE_RT)):
        assert packed.lookup(pc)[0] == tables.SIGNAL
    assert packed.lookup(at + len(RESTORE_RT) + 1)[0] != tables.SIGNAL


def test_chain_rows_cover_its_functions_with_sp_rules():
    """-O2 -fomit-frame-pointer: every function of the chain is CFA = rsp + N."""
    image = ElfImage.open(str(build("chain", flags=O2_NOFP)))
    packed = tables.for_image(image)
    for name in ("a", "b", "c", "d", "main"):
        (sym,) = image.find(name)
        assert packed.lookup(sym.address) == (tables.SP, 0, 0, 0, 8, 0, 0)


@pytest.mark.parametrize("which", ["libc", "chain-o2-nofp"])
def test_page_index_finds_the_same_rows(which):
    """The program searches only the rows of a pc's 4 KiB page."""
    path = LIBC if which == "libc" else str(build("chain", flags=O2_NOFP))
    image = ElfImage.open(path)
    table, _ = UnwindTable.for_image(image)
    packed = tables.for_image(image)
    pages = packed.pages()
    assert len(pages) // 4 == (packed.row(len(packed) - 1)[0] >> 12) - packed.first_page + 2
    for pc in _sample_pcs(table):
        assert packed.lookup(pc, pages) == packed.lookup(pc), hex(pc)
