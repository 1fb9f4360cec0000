"""DWARF unwinding against gdb: gdb stops a test program at a breakpoint and
hands us what perf would (registers, the stack copied from sp up, the
mappings) plus its own backtrace, which is the oracle. The unwinder must
find the same pcs, frame by frame, down to _start; the symbolizer must name
the program's own frames as gdb does."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import O2_NOFP, REPO, build, build_cxx, build_go, Capture, gdb_capture
from ustack.model import Mapping
from ustack.objfile import debuginfo
from ustack.objfile.elf import ElfImage
from ustack.symbols.symbolizer import Symbolizer
from ustack.unwind import cfi
from ustack.unwind.cfi import UnwindTable
from ustack.unwind.dwarf import DwarfUnwinder, truncation_note

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
NO_CFI = ("-O0", "-fno-omit-frame-pointer", "-fno-asynchronous-unwind-tables",
          "-fno-unwind-tables")


@pytest.fixture(autouse=True)
def cfi_cache(tmp_path_factory, monkeypatch):
    """Unwind tables of these tests go to a scratch cache, not ~/.cache."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def unwind(cap: Capture, stack: bytes = None, unwinder: DwarfUnwinder = None):
    unwinder = unwinder or DwarfUnwinder()
    return unwinder.unwind(cap.regs, cap.stack if stack is None else stack,
                           cap.find_mapping)


def table_of(path: str, debug_dirs=()) -> UnwindTable:
    """The unwind table the unwinder uses for the ELF file at path."""
    return UnwindTable.for_image(ElfImage.open(path), debug_dirs)[0]


def assert_like_gdb(cap: Capture, addrs, notes, until: str = None):
    """Same pcs as gdb down to its last frame (or `until`); the program's
    own frames named as gdb names them."""
    gdb_pcs, gdb_names = cap.gdb_pcs, cap.gdb_names
    if until is not None:
        n = gdb_names.index(until) + 1
        gdb_pcs, gdb_names = gdb_pcs[:n], gdb_names[:n]
        addrs = addrs[:n]
    frames = Symbolizer(cap).frames(cap.pid, addrs)
    ours = [f.function or hex(f.addr) for f in frames]
    assert [hex(a) for a in addrs] == [hex(p) for p in gdb_pcs], \
        f"\nours: {ours}\ngdb:  {gdb_names}\nnotes: {notes}"
    for frame, gname in zip(frames, gdb_names):
        if frame.module == cap.prog.name:
            # gdb shows C++ names without their parameters: leaf, not leaf(long)
            name = frame.function
            assert (name.split("(", 1)[0] if name.endswith(")") else name) == gname, \
                (ours, gdb_names)
        elif frame.function and gname:       # libc: symtab vs DWARF alias names
            # gcc's clones keep their origin's DWARF name: msort.part.0 ~ msort
            base = re.sub(r"\.(part|isra|constprop|cold)(\.\d+)?$", "",
                          frame.function)
            assert base.strip("_") in gname, (ours, gdb_names)


def readelf_frames(prog: Path) -> str:
    """readelf's decoding of the CFI: what the test programs are meant to contain."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed (binutils)")
    return subprocess.run([readelf, "--debug-dump=frames", str(prog)],
                          capture_output=True, text=True).stdout


# --- stacks against gdb -------------------------------------------------------------

@pytest.mark.parametrize("brk", ["d", "*d"], ids=["body", "entry"])
def test_chain_without_frame_pointers(tmp_path, brk):
    prog = build("chain", flags=O2_NOFP)
    cap = gdb_capture(prog, [1], brk, tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[:5] == ["d", "c", "b", "a", "main"]
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()                    # ends at _start by its END rule, cleanly


def test_chain_in_libc_write(tmp_path):
    prog = build("chain", flags=O2_NOFP)
    cap = gdb_capture(prog, [1, "write"], "write", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[1:6] == ["d", "c", "b", "a", "main"]
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


def test_qsort_callback(tmp_path):
    prog = build("qsort_cb", flags=O2_NOFP)
    cap = gdb_capture(prog, [64], "cmp", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[0] == "cmp" and "sort_things" in cap.gdb_names
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


def test_signal_handler(tmp_path):
    prog = build("sighandler", flags=O2_NOFP)
    cap = gdb_capture(prog, [1], "handler_leaf", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[:2] == ["handler_leaf", "handler"]
    assert "spin" in cap.gdb_names          # gdb crossed the signal frame
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


def test_realigned_stack_drap(tmp_path):
    """CFA and rbp given by DWARF expressions (gcc's DRAP realignment)."""
    prog = build("drap", flags=O2_NOFP)
    frames = readelf_frames(prog)
    if "DW_CFA_def_cfa_expression (DW_OP_breg6 (rbp)" not in frames:
        pytest.skip("this gcc did not realign mid's stack through DRAP")
    cap = gdb_capture(prog, [1], "leaf", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[:3] == ["leaf", "mid", "main"]
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


@pytest.mark.parametrize("brk", ["__vdso_clock_gettime", "*__vdso_clock_gettime"],
                         ids=["body", "entry"])
def test_vdso(tmp_path, brk):
    """A leaf in the vDSO: its CFI is read from a copy of our own vDSO."""
    prog = build("busy", flags=O2_NOFP)
    cap = gdb_capture(prog, [0.05], "main;" + brk, tmp_path)  # vDSO symbols: after start
    addrs, notes = unwind(cap)
    assert "spin_here" in cap.gdb_names
    assert cap.find_mapping(addrs[0]).path == "[vdso]"
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


def test_cxx_with_args_size(tmp_path):
    prog = build_cxx("cxx_throw", ("-O2", "-g", "-fomit-frame-pointer"))
    frames = readelf_frames(prog)
    assert "DW_CFA_GNU_args_size" in frames
    cap = gdb_capture(prog, [1], "leaf", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[:4] == ["leaf", "f2", "f1", "main"]
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


@pytest.mark.parametrize("brk", ["d", "*d"], ids=["body", "entry"])
def test_frame_pointer_fallback_without_cfi(tmp_path, brk):
    """No CFI in the program's own code: its frames use rbp (at the entry of
    d, before `push %rbp`, the return address is at [sp])."""
    prog = build("chain", flags=NO_CFI)
    cap = gdb_capture(prog, [1], brk, tmp_path)
    addrs, notes = unwind(cap)
    assert_like_gdb(cap, addrs, notes, until="main")
    assert notes == ("frame pointer used for chain: no CFI",)


def test_go_compressed_debug_frame(tmp_path):
    prog = build_go("gochain")
    cap = gdb_capture(prog, [3], "main.d", tmp_path)
    addrs, notes = unwind(cap)
    assert cap.gdb_names[:5] == ["main.d", "main.(*T).c", "main.b", "main.a", "main.main"]
    assert_like_gdb(cap, addrs, notes, until="main.main")
    assert notes == ()


@pytest.mark.parametrize("brk", ["main.d", "*'main.d'"], ids=["body", "entry"])
def test_go_without_cfi_or_symbols(tmp_path, brk):
    """A Go binary with neither CFI nor .symtab (objcopy --strip-all keeps
    the code and .gopclntab byte for byte): its frames follow the rows the
    in-kernel walk uses, from .gopclntab (the SP delta at every pc, main.d's
    entry included), so nothing falls back to the frame pointer."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("objcopy is not installed")
    full = build_go("gochain")
    stripped = tmp_path / "gochain"
    subprocess.run([objcopy, "--strip-all", str(full), str(stripped)], check=True)
    if _text(full) != _text(stripped):
        pytest.skip("objcopy changed the code; cannot swap the files")
    cap = gdb_capture(full, [3], brk, tmp_path)
    cap.open_instead(full, stripped)
    addrs, notes = unwind(cap)
    n = cap.gdb_names.index("main.main") + 1
    assert [hex(a) for a in addrs[:n]] == [hex(p) for p in cap.gdb_pcs[:n]]
    assert notes == ()


def _text(path: Path) -> tuple:
    """Where .text is and what it holds: all the unwinder reads from a file
    without CFI (the process itself runs the unstripped copy)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        sec = ELFFile(f).get_section_by_name(".text")
        return sec["sh_addr"], sec["sh_offset"], sec.data()


def test_separate_debug_file(tmp_path, monkeypatch):
    """CFI only in the debug file found by build-id (.debug_frame there,
    none in the stripped program): the table takes it from there."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("objcopy is not installed")
    flags = ("-O2", "-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables")
    prog = build("chain", flags=flags)
    build_id = ElfImage.open(str(prog)).build_id
    root = tmp_path / "debug"
    debug = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    debug.parent.mkdir(parents=True)
    subprocess.run([objcopy, "--only-keep-debug", str(prog), str(debug)], check=True)
    stripped = tmp_path / "chain"
    subprocess.run([objcopy, "--strip-debug", str(prog), str(stripped)], check=True)
    d = ElfImage.open(str(stripped)).find("d")[0].address

    assert table_of(str(stripped)).lookup(d) is None   # no debug root yet
    UnwindTable.clear_cache()
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(root)])
    assert table_of(str(stripped)).lookup(d) is not None

    cap = gdb_capture(prog, [1], "d", tmp_path)
    cap.open_instead(prog, stripped)
    addrs, notes = unwind(cap)
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()


def test_debug_file_found_like_the_symbolizer_finds_it(tmp_path, monkeypatch):
    """The unwinder's debug file comes from objfile/debuginfo: under the
    user's --debug-dir (DwarfUnwinder(debug_dirs=...)), by .gnu_debuglink,
    and a debug file of another build is refused and reported. Tables
    built with and without the debug file are told apart in memory and on disk."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        pytest.skip("objcopy is not installed")
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(tmp_path / "none")])
    flags = ("-O2", "-g", "-fomit-frame-pointer", "-fno-asynchronous-unwind-tables")
    prog = build("chain", flags=flags)
    build_id = ElfImage.open(str(prog)).build_id
    stripped = tmp_path / "chain"
    subprocess.run([objcopy, "--strip-debug", str(prog), str(stripped)], check=True)
    d = ElfImage.open(str(stripped)).find("d")[0].address
    cap = gdb_capture(prog, [1], "d", tmp_path)     # a stack in d, unwound from
    cap.open_instead(prog, stripped)                # the stripped copy

    def by_build_id(root, source):
        debug = root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        debug.parent.mkdir(parents=True)
        subprocess.run([objcopy, "--only-keep-debug", str(source), str(debug)], check=True)
        return str(root)

    mine = by_build_id(tmp_path / "mine", prog)
    assert table_of(str(stripped)).lookup(d) is None
    unwinder = DwarfUnwinder(debug_dirs=[mine])
    addrs, notes = unwind(cap, unwinder=unwinder)   # d's CFI from the debug file
    assert_like_gdb(cap, addrs, notes)
    assert notes == ()
    assert unwinder.warnings == []
    assert table_of(str(stripped)).lookup(d) is None      # memo: per debug dirs
    UnwindTable.clear_cache()
    assert table_of(str(stripped)).lookup(d) is None      # disk: per debug file
    assert table_of(str(stripped), (mine,)).lookup(d) is not None

    other = by_build_id(tmp_path / "other", build("chain", flags=O2_NOFP))
    unwinder = DwarfUnwinder(debug_dirs=[other])
    addrs, notes = unwind(cap, unwinder=unwinder)   # refused: no CFI for d
    assert notes == ("frame pointer used for chain: no CFI",)
    assert len(unwinder.warnings) == 1 and "does not match" in unwinder.warnings[0]

    linked = tmp_path / "linked" / "chain"
    linked.parent.mkdir()
    subprocess.run([objcopy, "--only-keep-debug", str(prog), str(linked) + ".debug"],
                   check=True)
    subprocess.run([objcopy, "--strip-debug", f"--add-gnu-debuglink={linked}.debug",
                    str(prog), str(linked)], check=True)
    assert table_of(str(linked)).lookup(d) is not None


# --- notes, PLT, cache -----------------------------------------------------------------

def test_truncated_stack_note(tmp_path):
    prog = build("chain", flags=O2_NOFP)
    cap = gdb_capture(prog, [1], "d", tmp_path)
    full, _ = unwind(cap)
    cut = cap.stack[:48]
    addrs, notes = unwind(cap, cut)
    assert notes == (truncation_note(48),)
    assert notes[0] == ("stack copy too small (48 bytes): the stack was cut short; "
                        "raise --stack-size")
    assert 1 <= len(addrs) < len(full) and addrs == full[:len(addrs)]
    assert unwind(cap, b"")[1] == (truncation_note(0),)


def test_plt_rule():
    """The .plt's CFA expression: rsp+8 before the entry's push, rsp+16 after."""
    prog = build("chain", flags=O2_NOFP)
    from elftools.elf.elffile import ELFFile
    with open(prog, "rb") as f:
        plt = ELFFile(f).get_section_by_name(".plt")
    if plt is None or plt["sh_size"] < 32:
        pytest.skip("chain has no lazy-binding .plt (linked with -z now?)")
    table = table_of(str(prog))
    entry = plt["sh_addr"] + 16                       # first entry after PLT0
    assert table.lookup(entry)[0] == cfi.CFA_PLT
    base = 0x555555554000
    mapping = Mapping(base, base + 0x100000, 0, str(prog))
    ret = base + entry - 0x100                        # any address: never followed
    for off, slot in ((0, 0), (11, 1)):               # jmp *GOT / jmp PLT0 after push
        stack = bytearray(64)
        stack[8 * slot:8 * slot + 8] = ret.to_bytes(8, "little")
        regs = {"ip": base + entry + off, "sp": 0x7ffd0000, "bp": 0}
        addrs, _ = DwarfUnwinder().unwind(regs, bytes(stack), lambda a: mapping)
        assert addrs[:2] == (regs["ip"], ret)


def _table_in_subprocess(cache: Path, path: str) -> dict:
    code = textwrap.dedent(f"""
        import json, time
        from ustack.objfile.elf import ElfImage
        from ustack.unwind.cfi import UnwindTable
        t = time.perf_counter()
        tab = UnwindTable.for_image(ElfImage.open({path!r}))[0]
        print(json.dumps(dict(parses=UnwindTable.parse_count, cached=tab.from_cache,
                              rows=len(tab), s=time.perf_counter() - t)))
    """)
    env = dict(os.environ, USTACK_CACHE_DIR=str(cache),
               PYTHONPATH=str(REPO / "src"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_cache_is_read_by_a_fresh_process(tmp_path):
    first = _table_in_subprocess(tmp_path, LIBC)
    assert first["parses"] == 1 and not first["cached"] and first["rows"] > 1000
    files = list((tmp_path / "cfi").glob("*.v[0-9]*"))
    assert len(files) == 1
    second = _table_in_subprocess(tmp_path, LIBC)
    assert second["parses"] == 0 and second["cached"] and second["rows"] == first["rows"]
    print(f"libc table: build {first['s']:.3f} s, load from cache {second['s']:.3f} s")
    # A corrupt cache file is ignored, rebuilt and replaced.
    files[0].write_bytes(files[0].read_bytes()[:100])
    third = _table_in_subprocess(tmp_path, LIBC)
    assert third["parses"] == 1 and third["rows"] == first["rows"]
    assert _table_in_subprocess(tmp_path, LIBC)["parses"] == 0


def _debug_frame(fdes: list) -> bytes:
    """A .debug_frame of one CIE (CFA = rsp + 8, return address at CFA - 8)
    and an FDE per (start, size, instructions)."""
    def entry(body: bytes) -> bytes:
        body += b"\0" * (-(len(body) + 4) % 8)          # DW_CFA_nop padding
        return len(body).to_bytes(4, "little") + body
    cie = entry(b"\xff\xff\xff\xff" + b"\x01" + b"\0" + b"\x01\x78\x10"
                + b"\x0c\x07\x08" + b"\x90\x01")
    out = cie
    for start, size, program in fdes:
        out += entry((0).to_bytes(4, "little") + start.to_bytes(8, "little")
                     + size.to_bytes(8, "little") + program)
    return out


def test_set_loc_rows_are_the_fdes_own(tmp_path):
    """DW_CFA_set_loc gives absolute addresses: FDEs whose other
    instructions are the same still get rows at their own addresses."""
    prog = build("chain", flags=NO_CFI)
    image = ElfImage.open(str(prog))
    starts = [image.symbols.find(name)[0].address for name in ("c", "d")]

    def program(start: int) -> bytes:       # set_loc +1: CFA rsp+16; set_loc +4: rsp+24
        return (b"\x01" + (start + 1).to_bytes(8, "little") + b"\x0e\x10"
                + b"\x01" + (start + 4).to_bytes(8, "little") + b"\x0e\x18")
    blob = tmp_path / "frame.bin"
    blob.write_bytes(_debug_frame([(s, 16, program(s)) for s in starts]))
    out = tmp_path / "chain_set_loc"
    subprocess.run(["objcopy", "--add-section", f".debug_frame={blob}", str(prog), str(out)],
                   check=True)
    table = table_of(str(out))
    for start in starts:
        assert [table.lookup(start + k)[:2] for k in (0, 1, 3, 4, 15)] == [
            (cfi.CFA_SP, 8), (cfi.CFA_SP, 16), (cfi.CFA_SP, 16), (cfi.CFA_SP, 24),
            (cfi.CFA_SP, 24)]
        assert table.lookup(start + 16) is None
