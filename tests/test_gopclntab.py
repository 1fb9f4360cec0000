"""Go's .gopclntab (objfile/gopclntab.py) on binaries built by apt's Go:
stripped (-ldflags=-s -w) and unstripped copies must give the same names
and file:line for the same pcs, agreeing with Go's own `go tool addr2line`
and with the ELF symbols of the unstripped copy; inlined calls agree with
the source (call sites marked in goinline/main.go) and with binutils'
`addr2line -i` reading the DWARF. Corrupt tables: a clear error or no
name, never a traceback. End to end: traces of the stripped programs."""
from __future__ import annotations

import random
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from helpers import PROGRAMS, build_go, fail_one_line, ok, parse_trace, run_ustack

from ustack.objfile.elf import ElfImage
from ustack.objfile.gopclntab import GoFrame, Pclntab, PclntabError, go_table

INLINE_SRC = PROGRAMS / "goinline" / "main.go"


def marked_line(mark: str) -> int:
    """The line of goinline/main.go that carries `// MARK`."""
    return source_line(lambda line: line.rstrip().endswith(f"// {mark}"))


def source_line(pred) -> int:
    for n, line in enumerate(INLINE_SRC.read_text().splitlines(), 1):
        if pred(line):
            return n
    raise AssertionError(f"no such line in {INLINE_SRC}")


@pytest.fixture(scope="module")
def gochain():
    return build_go("gochain"), build_go("gochain", strip=True)


@pytest.fixture(scope="module")
def goinline():
    return build_go("goinline"), build_go("goinline", strip=True)


def sample_pcs(table: Pclntab, seed: int = 1) -> list:
    """Each function's entry and one pc inside it."""
    rng = random.Random(seed)
    pcs = []
    for _name, entry, end in table.functions():
        pcs += [entry, rng.randrange(entry, end)]
    return pcs


def go_addr2line(binary: Path, pcs: list) -> list:
    """`go tool addr2line`: (outermost function, innermost 'file:line')."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed (go tool addr2line is the oracle)")
    out = subprocess.run(["go", "tool", "addr2line", str(binary)],
                         input="".join(f"0x{pc:x}\n" for pc in pcs),
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return [(out[2 * i], out[2 * i + 1]) for i in range(len(pcs))]


# --- names and lines -----------------------------------------------------------

def test_stripped_and_unstripped_agree_with_go_addr2line(gochain):
    full, stripped = gochain
    assert ".symtab" not in ElfImage.open(stripped).section_names
    t_full, t_bare = go_table(ElfImage.open(full)), go_table(ElfImage.open(stripped))
    assert t_bare.version == "1.18"          # Go 1.19 writes the 1.18 layout
    pcs = sample_pcs(t_bare)
    assert len(pcs) > 2000
    oracle = go_addr2line(full, pcs)
    for pc, (func, where) in zip(pcs, oracle):
        frames = t_bare.frames(pc)
        assert frames == t_full.frames(pc), hex(pc)
        inner = frames[0]
        mine = (frames[-1].function, f"{inner.file}:{inner.line}" if inner.line else ":-1")
        assert mine == (func, where), hex(pc)


def test_names_match_the_unstripped_symbol_table(gochain):
    full, stripped = gochain
    table = go_table(ElfImage.open(stripped))
    names: dict = {}   # address -> the .symtab names there (runtime.text aliases one)
    for s in ElfImage.open(full).functions:
        if s.size:
            # assembly functions are NAME.abi0 in .symtab, NAME in the table,
            # and the table shortens array types: type..eq.[5]T -> [...]T
            name = re.sub(r"\[\d+\]", "[...]", s.name.removesuffix(".abi0"))
            names.setdefault(s.address, set()).add(name)
    assert len(names) > 1000
    for addr, there in names.items():
        found = table.find(addr)
        assert found is not None and found.entry == addr and found.name in there, there


def test_main_functions_by_line(gochain):
    """Each main.* function's entry is on its `func` line of main.go."""
    _, stripped = gochain
    src = (PROGRAMS / "gochain" / "main.go").read_text().splitlines()
    table = go_table(ElfImage.open(stripped))
    want = {"main.d": "func d(", "main.(*T).c": "func (t *T) c(",
            "main.b": "func b(", "main.a": "func a(", "main.main": "func main("}
    for name, text in want.items():
        (entry,) = [e for n, e, _ in table.functions() if n == name]
        file, line = table.source(entry)
        assert Path(file).name == "main.go" and src[line - 1].startswith(text), name


# --- inlined calls ---------------------------------------------------------------

def call_pc(image: ElfImage, caller: str, callee: str) -> int:
    """The return address of the call to `callee` in `caller` (objdump)."""
    sym = image.find(caller)[0]
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn",
                          f"--start-address=0x{sym.address:x}",
                          f"--stop-address=0x{sym.address + sym.size:x}", image.path],
                         capture_output=True, text=True, check=True).stdout
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if "call" in line and f"<{callee}>" in line:
            return int(lines[i + 1].split(":")[0], 16)
    raise AssertionError(f"no call to {callee} in {caller}:\n{out}")


def test_inline_tree_from_source(goinline):
    full, stripped = goinline
    image = ElfImage.open(full)
    ret = call_pc(image, "main.top", "main.leaf")
    file = str(INLINE_SRC.resolve())
    want = [GoFrame("main.inner", file, marked_line("CALL-LEAF"), True),
            GoFrame("main.mid", file, marked_line("CALL-INNER"), True),
            GoFrame("main.top", file, marked_line("CALL-MID"), False)]
    frames = go_table(ElfImage.open(stripped)).frames(ret - 1)
    assert [(f.function, Path(f.file).name, f.line, f.inlined) for f in frames] == \
        [(f.function, "main.go", f.line, f.inlined) for f in want]
    assert frames == go_table(image).frames(ret - 1)


def test_inlines_agree_with_dwarf(goinline):
    """binutils addr2line -i reads Go's DWARF inline records: same number
    of frames and the same file:line at every level, for every pc of every
    function that has inlined calls. (Its names are not an oracle: it
    often prints the enclosing function's name for an inlined one.)"""
    full, stripped = goinline
    table = go_table(ElfImage.open(stripped))
    pcs = [pc for pc in sample_pcs(table, seed=2) + [call_pc(ElfImage.open(full),
                                                            "main.top", "main.leaf") - 1]
           # DWARF has no inline records for <autogenerated> wrappers
           if len(table.frames(pc)) > 1 and table.frames(pc)[-1].file != "<autogenerated>"]
    assert len(pcs) > 20
    out = subprocess.run(["addr2line", "-a", "-i", "-f", "-e", str(full)],
                         input="".join(f"0x{p:x}\n" for p in pcs),
                         capture_output=True, text=True, check=True).stdout
    blocks = [b for b in re.split(r"^0x[0-9a-f]+\n", out, flags=re.M) if b]
    for pc, block in zip(pcs, blocks):
        rows = block.splitlines()
        dwarf = [(rows[i], rows[i + 1].split(" (discriminator")[0])
                 for i in range(0, len(rows), 2)]
        mine = [(f.function, f"{f.file}:{f.line}") for f in table.frames(pc)]
        assert [w for _, w in mine] == [w for _, w in dwarf], hex(pc)


# --- corrupt tables --------------------------------------------------------------

def table_bytes(binary: Path) -> tuple:
    image = ElfImage.open(binary)
    addr, off, size = image.sections[".gopclntab"]
    return Path(binary).read_bytes()[off:off + size], addr, off


def functab_row(data: bytes, i: int) -> tuple:
    """(entry pc, offset of its _func in data) of function i, read straight
    from the table as runtime/symtab.go lays it out since Go 1.18: the
    pcHeader (magic, 2 pad bytes, minLC, ptrSize, then words nfunc, nfiles,
    textStart, funcnameOffset, cuOffset, filetabOffset, pctabOffset,
    pclnOffset), and at pclnOffset the functab's (entryoff, funcoff) u32 pairs."""
    magic, ptrsize = struct.unpack_from("<I", data)[0], data[7]
    assert magic in (0xFFFFFFF0, 0xFFFFFFF1), f"not a Go 1.18+ table: {magic:#x}"
    words = struct.unpack_from("<8" + ("Q" if ptrsize == 8 else "I"), data, 8)
    text_start, pcln = words[2], words[7]
    entryoff, funcoff = struct.unpack_from("<II", data, pcln + 8 * i)
    return text_start + entryoff, pcln + funcoff


def test_corrupt_headers_are_refused(gochain):
    data, addr, _ = table_bytes(gochain[1])
    cases = {
        b"\x00" * 8 + data[8:]: "unsupported .gopclntab (magic 0x00000000; Go 1.16 or newer is needed)",
        data[:12]: "corrupt .gopclntab: shorter than its header",
        data[:4] + b"\x00\x00\x03\x08" + data[8:]: "corrupt .gopclntab header",
        data[:8] + struct.pack("<Q", 1 << 40) + data[16:]: "corrupt .gopclntab: function table out of bounds",
        data[:4096]: "corrupt .gopclntab: an offset points outside it",
    }
    for blob, message in cases.items():
        with pytest.raises(PclntabError) as e:
            Pclntab(blob, addr)
        assert str(e.value) == message


def test_flipped_bytes_never_raise(gochain):
    """Damage anywhere in the table: a lookup returns frames or nothing,
    and an entry that disagrees with its function table is not named."""
    data, addr, _ = table_bytes(gochain[1])
    good = Pclntab(data, addr)
    pcs = sample_pcs(good)[::7]
    rng = random.Random(7)
    for _ in range(60):
        blob = bytearray(data)
        for _ in range(50):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        try:
            table = Pclntab(bytes(blob), addr)
        except PclntabError:
            continue
        for pc in pcs:
            table.frames(pc)
            table.source(pc)
    # an _func whose entry disagrees with the function table: no name
    i = len(good) // 2
    entry, off = functab_row(data, i)
    assert (good.find(entry).entry, good.find(entry).index) == (entry, i)
    blob = bytearray(data)
    blob[off:off + 4] = struct.pack("<I", 0x7FFFFFF0)
    table = Pclntab(bytes(blob), addr)
    assert table.find(entry) is None
    assert table.frames(entry) == []


@pytest.mark.kernel
def test_corrupt_table_probe_is_one_clear_line(gochain, tmp_path):
    _, stripped = gochain
    _, _, off = table_bytes(stripped)
    bad = tmp_path / "gochain"
    blob = bytearray(Path(stripped).read_bytes())
    blob[off:off + 4] = b"\x00\x00\x00\x00"
    bad.write_bytes(bytes(blob))
    bad.chmod(0o755)
    msg = fail_one_line(run_ustack("trace", f"uprobe:{bad}:main.d", "-c", f"{bad} 1"))
    assert msg == (f"ustack: no function 'main.d' in {bad} ({bad} has no symbol table; "
                   f"unsupported .gopclntab (magic 0x00000000; Go 1.16 or newer is needed))")


# --- end to end --------------------------------------------------------------------

LINE = re.compile(r"^ 0x(?P<addr>[0-9a-f]{16}) : (?P<func>.+?)(?:\+0x[0-9a-f]+/0x[0-9a-f]+| \(inlined\))"
                  r" \[(?P<module>[^\]]+)\](?: (?P<file>\S+):(?P<line>\d+))?$")


def trace_lines(out: str) -> list:
    """`ustack trace --lines [--inlines]` frames of the first record:
    (addr, func, inlined, file, line)."""
    block = out.split("\n\n")[0].splitlines()[1:]
    rows = []
    for line in block:
        m = LINE.match(line)
        assert m, line
        rows.append((int(m["addr"], 16), m["func"], "(inlined)" in line,
                     m["file"], int(m["line"] or 0)))
    return rows


@pytest.mark.kernel
def test_trace_stripped_go_names(gochain):
    full, stripped = gochain
    want = ["main.d", "main.(*T).c", "main.b", "main.a", "main.main",
            "runtime.main", "runtime.goexit"]
    for binary in (full, stripped):
        res = ok(run_ustack("trace", f"uprobe:{binary}:main.d", "-c", f"{binary} 2"))
        records = parse_trace(res.stdout)
        assert len(records) == 2
        for rec in records:
            # .symtab calls assembly functions NAME.abi0; .gopclntab NAME
            names = [f["func"] for f in rec["frames"]]
            assert [n.removesuffix(".abi0") for n in names] == want, res.stdout
            assert names == want or binary == full
            assert {f["module"] for f in rec["frames"]} == {"gochain"}


@pytest.mark.parametrize("pie", ["internal", "external"])
def test_pie_functions_match_the_symbol_table(pie):
    """A PIE linked by gcc (as every cgo program is) starts .text with C
    start-up code and leaves its pointers to the loader: the table's
    functions must still sit at their .symtab addresses, stripped or not."""
    full = build_go("goinline", pie=pie)
    stripped = build_go("goinline", strip=True, pie=pie)
    symtab = {s.name: s.address for s in ElfImage.open(full).functions
              if s.name.startswith("main.")}
    assert {"main.top", "main.leaf", "main.main"} <= set(symtab)
    for image in (ElfImage.open(full), ElfImage.open(stripped)):
        entries = {n: e for n, e, _ in go_table(image).functions() if n in symtab}
        assert entries == symtab


@pytest.mark.kernel
@pytest.mark.parametrize("pie", ["", "internal", "external"])
def test_trace_stripped_go_lines_and_inlines(pie):
    full = build_go("goinline", pie=pie)
    stripped = build_go("goinline", strip=True, pie=pie)
    res = ok(run_ustack("trace", "--lines", "--inlines", f"uprobe:{stripped}:main.leaf",
                        "-c", f"{stripped} 1"))
    rows = trace_lines(res.stdout)
    src = str(INLINE_SRC.resolve())
    plain = build_go("goinline")          # the oracle reads a non-PIE binary
    leaf_entry = ElfImage.open(plain).find("main.leaf")[0].address
    leaf_line = int(go_addr2line(plain, [leaf_entry])[0][1].rsplit(":", 1)[1])
    assert [(f, i, Path(file or "").name == "main.go" and ln)
            for _, f, i, file, ln in rows[:5]] == [
        ("main.leaf", False, leaf_line),
        ("main.inner", True, marked_line("CALL-LEAF")),
        ("main.mid", True, marked_line("CALL-INNER")),
        ("main.top", False, marked_line("CALL-MID")),
        ("main.main", False, source_line(lambda l: l.strip() == "top(i)"))]
    assert rows[0][3] == src
    # inlined frames share the pc of the frame they were inlined into
    assert rows[1][0] == rows[2][0] == rows[3][0]
    if not pie:  # go tool addr2line on the unstripped copy: outermost name, innermost line
        func, where = go_addr2line(full, [rows[3][0] - 1])[0]
        assert (func, where) == ("main.top", f"{src}:{marked_line('CALL-LEAF')}")
    # without --inlines: the function that holds the pc, at its own line
    res = ok(run_ustack("trace", "--lines", f"uprobe:{stripped}:main.leaf",
                        "-c", f"{stripped} 1"))
    rows = trace_lines(res.stdout)
    assert [(f, ln) for _, f, _, _, ln in rows[:2]] == [
        ("main.leaf", leaf_line), ("main.top", marked_line("CALL-MID"))]
