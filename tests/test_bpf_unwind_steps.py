"""The in-kernel unwinder's binary search and rule interpretation, run in
the kernel (BPF_PROG_TEST_RUN through tests/programs/bpf/unwind_check.bpf.c,
which runs src/ustack/bpf/unwind.h's step) on the rows of known programs,
page index included: one step from each sampled pc over a made-up stack
must move the registers as the row the Python side packed says."""
from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

from helpers import O2_NOFP, PROGRAMS, build
from ustack.bpf import build as bpf_build
from ustack.capture import bpf_unwind as uw
from ustack.capture import unwind_objects
from ustack.capture.kernel_offsets import Offsets
from ustack.kernel import bpf_syscall
from ustack.kernel.bpf_object import BpfObject
from ustack.model import (KERNEL_UNWIND_REASONS, KERNEL_UNWIND_THROUGH_JIT,
                          KERNEL_UNWIND_THROUGH_NO_CFI)
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables
from ustack.unwind.cfi import BP_AT, BP_AT_BP, BP_SAME, BX_AT, BX_LOST, BX_SAME

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
LDSO = "/lib64/ld-linux-x86-64.so.2"     # its lazy-binding resolver's CFA is rbx-based
# a stack in kernel space: any word outside the window fails to read
BASE = 0xFFFFA00000000000
WINDOW = 512
SP = BASE + 128
BP = BASE + 256
BX = BASE + 192


def word(addr: int) -> int | None:
    """The made-up stack's word at addr, None outside the window."""
    return 0x10000000 + (addr - BASE) if BASE <= addr <= BASE + WINDOW - 8 else None


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if shutil.which("clang") is None:
        pytest.skip("clang is not installed: the check program cannot be built")
    out = tmp_path_factory.mktemp("bpf") / "unwind_check.bpf.o"
    subprocess.run(["clang", *bpf_build.CLANG_FLAGS, f"-I{bpf_build.HERE}", "-c",
                    str(PROGRAMS / "bpf" / "unwind_check.bpf.c"), "-o", str(out)], check=True)
    return BpfObject(str(out))


STATUS = uw.unwind_object().enum("unwind_status")


def _expected(row, pc: int) -> tuple:
    """(status, pc, sp, bp, bp_ok, bx, bx_ok) after one step from pc, per the row."""
    s = STATUS
    if row is None or row[0] == tables.GAP:
        # code without CFI, with rbp set: the frame-pointer rule, CFA =
        # rbp + 16; no CFI says where rbx is
        row = (tables.BP, BP_AT, BX_LOST, 0, 16, -16, 0)
    kind, bp_rule, bx_rule, aux, cfa_off, bp_off, bx_off = row
    if kind == tables.END:
        return (s["COMPLETE"],)
    if kind == tables.UNSUPPORTED:
        return (s["UNSUPPORTED"],)
    if kind in (tables.SP_DEREF, tables.BP_DEREF):
        base = word((SP if kind == tables.SP_DEREF else BP) + cfa_off)
        if base is None:
            return (s["READ_FAILED"],)
        cfa = base + aux
    elif kind == tables.BP:
        cfa = BP + cfa_off
    elif kind == tables.BX:
        cfa = BX + cfa_off
    else:
        cfa = SP + cfa_off + (8 if kind == tables.PLT and (pc & 15) >= aux else 0)
    ra = word(cfa - 8)
    if ra is None:
        return (s["READ_FAILED"],)
    bp, bp_ok = BP, 1
    if bp_rule in (BP_AT, BP_AT_BP):
        bp = word((cfa if bp_rule == BP_AT else BP) + bp_off)
        bp_ok = int(bp is not None)
        bp = bp or 0
    elif bp_rule != BP_SAME:
        bp_ok = 0
    bx, bx_ok = BX, 1
    if bx_rule == BX_AT:
        bx = word(cfa + bx_off)
        bx_ok = int(bx is not None)
        bx = bx or 0
    elif bx_rule != BX_SAME:
        bx_ok = 0
    if cfa <= SP and not (kind == tables.BP and aux == tables.STACK_SWITCH):
        return (s["NO_PROGRESS"],)
    return (s["RUNNING"], ra, cfa, bp, bp_ok, bx, bx_ok)


def test_stop_reasons_are_the_ones_the_notes_name():
    """The C's stop reasons are those model.py turns into notes."""
    assert {STATUS[name] for name in ("NO_MAPPING", "NO_FILE", "NO_TABLE", "NO_CFI", "GAP",
                                      "UNSUPPORTED", "NO_BP", "READ_FAILED", "NO_PROGRESS",
                                      "TRUNCATED", "VMA_BUSY", "TABLE_FULL", "NO_BX")} \
        == set(KERNEL_UNWIND_REASONS)
    assert STATUS["THROUGH_JIT"] == KERNEL_UNWIND_THROUGH_JIT
    assert STATUS["THROUGH_NO_CFI"] == KERNEL_UNWIND_THROUGH_NO_CFI


@pytest.mark.parametrize("which", ["libc", "ld.so", "chain-o2-nofp", "drap-o2-nofp"])
def test_one_step_follows_the_row(harness, which):
    path = {"libc": LIBC, "ld.so": LDSO}.get(which) or str(build(which.split("-")[0],
                                                                  flags=O2_NOFP))
    image = ElfImage.open(path)
    packed = tables.for_image(image)
    signal = tables.signal_trampolines(image)
    layout = harness.layout("walk")
    maps = uw.UnwindMaps(1 << 16, 16, 16)
    named = maps.named()
    ours = set(named)
    fd = -1
    try:
        objects = unwind_objects.UnwindObjects(maps, lambda _image, **_how: packed)
        objects.add_path(path)
        st = os.stat(path)
        first, rows, _adj, page_slot, first_page, pages, *_runtimes = unwind_objects.OBJ_VALUE.unpack(
            maps.objects.lookup(unwind_objects.OBJ_KEY.pack(unwind_objects.kernel_dev(st.st_dev), st.st_ino)))
        assert pages > 0                     # the page index is searched too
        if which == "libc":                  # its rows cross from one chunk into the next
            chunk = maps.rows.chunk_rows
            assert first // chunk < (first + rows - 1) // chunk, (first, rows, chunk)
        fd = harness.load("unwind_check", named, uw.kernel_rodata(Offsets.of_this_kernel(), maps))
        window = b"".join((0x10000000 + k).to_bytes(8, "little") for k in range(0, WINDOW, 8))
        starts = [packed.row(i)[0] for i in range(len(packed))]
        rnd = random.Random(23)
        pcs = {s + d for s in rnd.sample(starts, min(len(starts), 600)) for d in (-1, 0, 1)}
        pcs |= {starts[0] - 1, starts[-1] + 100}
        # and every row of the rarer kinds (ld.so's rbx-based CFAs, DRAP)
        pcs |= {packed.row(i)[0] for i in range(len(packed))
                if packed.row(i)[1] in (tables.BX, tables.SP_DEREF, tables.BP_DEREF)}
        checked = walked = lost_bx = 0
        for pc in sorted(pcs):
            if any(at - 1 <= pc < at + 16 for at in signal):
                continue
            state = dict.fromkeys(layout.fields, 0)
            state.update({"pc": pc, "sp": SP, "bp": BP, "exact": 1, "bp_ok": 1,
                          "bx": BX, "bx_ok": 1,
                          "mend": (1 << 64) - 1, "first": first, "rows": rows,
                          "page_slot": page_slot, "first_page": first_page, "pages": pages,
                          "win": BASE, "rec.head.frames": 1,
                          "rec.head.status": STATUS["RUNNING"],
                          "frame": pc.to_bytes(8, "little").ljust(8 * uw.MAX_FRAMES, b"\0"),
                          "frame_fp": bytes(8 * uw.MAX_FRAMES),
                          "window": window.ljust(layout.size - layout.offsets["window"],
                                                 b"\0")})
            named["given"].update(bytes(4), layout.struct.pack(*state.values()))
            assert bpf_syscall.test_run(fd, (1).to_bytes(8, "little")) == 0
            got = dict(zip(layout.fields, layout.struct.unpack(named["given"].lookup(bytes(4)))))
            want = _expected(packed.lookup(pc), pc)
            status = got["rec.head.status"]
            if want[0] != STATUS["RUNNING"]:
                assert (status, got["rec.head.frames"]) == (want[0], 1), hex(pc)
            else:
                assert (status, got["pc"], got["sp"], got["bp"], got["bp_ok"], got["bx"],
                        got["bx_ok"]) == want, hex(pc)
                assert got["frame"][8:16] == want[1].to_bytes(8, "little")
                assert got["rec.head.frames"] == 2
                walked += 1
            checked += 1
            # a CFA in rbx, with rbx lost: a stop that says so
            if (packed.lookup(pc) or tables.NO_ROW)[0] == tables.BX:
                state.update({"bx_ok": 0, "rec.head.frames": 1,
                              "rec.head.status": STATUS["RUNNING"]})
                named["given"].update(bytes(4), layout.struct.pack(*state.values()))
                assert bpf_syscall.test_run(fd, (1).to_bytes(8, "little")) == 0
                got = dict(zip(layout.fields,
                               layout.struct.unpack(named["given"].lookup(bytes(4)))))
                assert (got["rec.head.status"], got["rec.head.frames"]) == (STATUS["NO_BX"], 1)
                lost_bx += 1
        assert lost_bx >= (9 if which == "ld.so" else 0)   # its resolvers and TLS descriptors
        # every sampled pc but the trampoline's, most of them a step up
        assert checked >= len(pcs) - 18 and walked > checked // 2
    finally:
        if fd >= 0:
            os.close(fd)
        for name in set(named) - ours:      # made by the loader: GIVEN, and the like
            named[name].close()
        maps.close()
