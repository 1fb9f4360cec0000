"""--lines and --inlines against eu-addr2line -i and binutils addr2line -i:
tests/programs/inline.c at -O2 -g (middle and inner always inlined into
outer), and libc through libc6-dbg's debug file."""
import os
import random
import re
import shutil
import subprocess

import pytest

from helpers import (BASE, O2_FP, addr2line_chains, build, call_returns, FakeMaps,
                     instructions, ours, require_libdw, run, run_ustack, text_mapping)

from ustack.native import libdeflate, libdw
from ustack.objfile import cache as objcache
from ustack.objfile import content_key, debuginfo, dwarf_image, dwarf_lines, symcache
from ustack.objfile.dwarf_lines import LineTable
from ustack.objfile.dwarf_units import DwarfUnits
from ustack.objfile.elf import ElfImage
from ustack.symbols.symbolizer import SymbolOptions, Symbolizer

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    LineTable.clear_cache()
    ElfImage.clear_cache()


@pytest.fixture
def prog():
    return build("inline", flags=O2_FP)


@pytest.fixture(params=["libdw", "symcache"])
def source(request, monkeypatch):
    """What answers a cold run: libdw, unit by unit; or, libdw missing, the
    SymCache symbolic builds of the whole file."""
    if request.param == "symcache":
        monkeypatch.setattr(libdw, "available", lambda: False)
    else:
        require_libdw()
    return request.param


def cold_and_warm(path, addrs, source):
    """ours() of a cold cache (libdw answers, or the SymCache is built),
    checked against a warm run as a new process makes it: the same answers,
    read back from the disk cache without libdw or a new SymCache."""
    built, asked = LineTable.built_symcaches, LineTable.libdw_lookups
    cold = ours(path, addrs)
    if source == "libdw":
        assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (built, asked + len(addrs))
    else:
        assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (built + 1, asked)
    LineTable.clear_cache()
    assert ours(path, addrs) == cold
    assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (
        built + (source == "symcache"), asked + len(addrs) * (source == "libdw"))
    return cold


@pytest.mark.parametrize("tool", ["eu-addr2line", "addr2line"])
def test_every_instruction_agrees_with_addr2line(prog, tool, source):
    addrs = instructions(prog, {"outer", "main", "sink"})
    assert len(addrs) > 30
    want = addr2line_chains(tool, prog, addrs)
    got = cold_and_warm(prog, addrs, source)
    assert {a: got[a] for a in addrs} == {a: want[a] for a in addrs}
    # the test set does exercise inlining, two levels deep
    assert max(len(c) for c in got.values()) == 3


def test_cxx_lines_agree_with_eu_addr2line(source):
    """C++ at -O2: inlined frames by their DWARF linkage names (demangled
    later, like every name), files and lines as eu-addr2line gives them."""
    from helpers import build_cxx
    cxx = build_cxx("cxx_throw", ("-O2", "-g", "-fno-omit-frame-pointer"))
    image = ElfImage.open(str(cxx))
    own = {s.name for s in image.functions if s.name.startswith("_Z") or s.name == "main"}
    addrs = instructions(cxx, own)
    assert len(addrs) > 50
    want = addr2line_chains("eu-addr2line", cxx, addrs)
    got = cold_and_warm(cxx, addrs, source)
    assert [(a, got[a][:-1], got[a][-1][1:]) for a in addrs] == \
        [(a, want[a][:-1], want[a][-1][1:]) for a in addrs]
    assert any(len(c) > 1 for c in got.values())           # inlined calls checked


def test_inlined_calls_become_frames(prog):
    """The stack at sink: the return address in outer is inside inner, inlined
    into middle, inlined into outer."""
    rets = call_returns(prog, "outer", "sink")
    assert len(rets) == 2                                  # inner inlined twice
    main_ret = call_returns(prog, "main", "outer")[0]
    sink = next(s.address for s in ElfImage.open(str(prog)).find("sink"))
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(prog), BASE)]}),
                     SymbolOptions(lines=True, inlines=True))
    for ret in rets:
        frames = sym.frames(1, [BASE + sink, BASE + ret, BASE + main_ret])
        oracle = addr2line_chains("eu-addr2line", prog, [sink, ret - 1, main_ret - 1])
        want = [c for a in (sink, ret - 1, main_ret - 1) for c in oracle[a]]
        assert [(f.function, f.file, f.line) for f in frames] == want
        assert [(f.function, f.inlined) for f in frames] == [
            ("sink", False), ("inner", True), ("middle", True), ("outer", False),
            ("main", False)]
        assert {f.addr for f in frames[1:4]} == {BASE + ret}
        assert frames[3].offset == ret - next(
            s.address for s in ElfImage.open(str(prog)).find("outer"))
    # the two inlined copies of inner are called from different lines of middle
    lines = [sym.frames(1, [BASE + r], leaf_is_exact=False)[1].line for r in rets]
    assert lines[0] != lines[1]


def test_lines_without_inlines_keep_the_real_functions_line(prog):
    ret = call_returns(prog, "outer", "sink")[0]
    oracle = addr2line_chains("addr2line", prog, [ret - 1])[ret - 1]
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(prog), BASE)]}),
                     SymbolOptions(lines=True))
    (f,) = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    assert (f.function, f.file, f.line, f.inlined) == ("outer", *oracle[-1][1:], False)
    # --inlines alone: the frames, no lines
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(prog), BASE)]}),
                     SymbolOptions(inlines=True))
    frames = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    assert [(f.function, f.line) for f in frames] == [
        ("inner", 0), ("middle", 0), ("outer", 0)]


def test_lines_found_in_the_debug_file(prog, tmp_path, monkeypatch):
    """A stripped program: lines and inlines come from its debug file."""
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy is not installed")
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(tmp_path / "none")])
    stripped = tmp_path / "inline"
    subprocess.run(["objcopy", "--only-keep-debug", str(prog), str(tmp_path / "inline.debug")],
                   check=True)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={tmp_path}/inline.debug",
                    str(prog), str(stripped)], check=True)
    ret = call_returns(prog, "outer", "sink")[1]
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(stripped), BASE)]}),
                     SymbolOptions(lines=True, inlines=True))
    frames = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    want = addr2line_chains("eu-addr2line", prog, [ret - 1])[ret - 1]
    assert [(f.function, f.file, f.line) for f in frames] == want


def symcache_path(tmp_path, binary):
    """Where the SymCache of `binary` (this very file) is kept."""
    return tmp_path / "cache" / "lines" / f"{content_key.of_dwarf(os.stat(binary), None)}.symcache9"


def test_symcache_built_once_and_read_back(prog, tmp_path, monkeypatch):
    """Without libdw the first lookup builds the file's SymCache (no DWARF
    unit parsed by pyelftools) and stores it, private; a new table reads it
    back."""
    monkeypatch.setattr(libdw, "available", lambda: False)
    ret = call_returns(prog, "outer", "sink")[0]
    built, parsed = LineTable.built_symcaches, DwarfUnits.parsed_units
    first = ours(prog, [ret - 1])
    assert (LineTable.built_symcaches, DwarfUnits.parsed_units) == (built + 1, parsed)
    cached = symcache_path(tmp_path, prog)
    assert oct(cached.stat().st_mode & 0o777) == "0o600"
    assert oct(cached.parent.stat().st_mode & 0o777) == "0o700"
    LineTable.clear_cache()
    assert ours(prog, [ret - 1]) == first
    assert (LineTable.built_symcaches, DwarfUnits.parsed_units) == (built + 1, parsed)


def test_libdw_answers_are_kept_for_the_next_run(prog, tmp_path):
    """A cold lookup asks libdw alone (no SymCache, no pyelftools); its
    answers are stored, private, and a new table answers the same addresses
    from them: libdw is not asked again. A new address is."""
    require_libdw()
    rets = call_returns(prog, "outer", "sink")
    built, parsed = LineTable.built_symcaches, DwarfUnits.parsed_units
    first = cold_and_warm(prog, rets[:1], "libdw")
    assert (LineTable.built_symcaches, DwarfUnits.parsed_units) == (built, parsed)
    memo = symcache_path(tmp_path, prog).with_suffix(".memo1.json")
    assert oct(memo.stat().st_mode & 0o777) == "0o600"
    asked = LineTable.libdw_lookups
    assert ours(prog, rets[:2])[rets[0]] == first[rets[0]]
    assert LineTable.libdw_lookups == asked + 1
    assert not symcache_path(tmp_path, prog).exists()


@pytest.mark.parametrize("plant", ["others-writable", "other-owner", "damaged"])
def test_untrusted_or_damaged_libdw_answers_are_not_read(prog, tmp_path, plant):
    """Kept answers someone else could have written, or that do not parse,
    are not believed: libdw is asked again and gives the right ones."""
    require_libdw()
    rets = call_returns(prog, "outer", "sink")
    want = cold_and_warm(prog, rets, "libdw")
    memo = symcache_path(tmp_path, prog).with_suffix(".memo1.json")
    kept = objcache.read(str(memo)).decode()
    forged = kept.replace('"inner"', '"forged"').replace('"middle"', '"forged"')
    assert forged != kept
    # its checksum made to match: what the memo's own reader meets
    objcache.write(str(memo), (forged if plant != "damaged"
                               else forged[:len(forged) // 2]).encode())
    if plant == "others-writable":
        memo.chmod(0o666)
    elif plant == "other-owner":
        os.chown(memo, 65534, 65534)
    LineTable.clear_cache()
    asked = LineTable.libdw_lookups
    assert ours(prog, rets) == want
    assert LineTable.libdw_lookups == asked + len(rets)


def test_symcache_built_after_many_libdw_answers(prog, tmp_path, monkeypatch):
    """Once libdw has answered BUILD_AFTER addresses of a file (kept ones
    count), the next one it is asked builds the file's SymCache: the rest of
    that run and later runs answer from it, the same."""
    require_libdw()
    monkeypatch.setattr(dwarf_lines, "BUILD_AFTER", 5)
    addrs = instructions(prog, {"outer", "main", "sink"})
    want = addr2line_chains("eu-addr2line", prog, addrs)
    built, asked = LineTable.built_symcaches, LineTable.libdw_lookups
    assert ours(prog, addrs[:3]) == {a: want[a] for a in addrs[:3]}
    LineTable.clear_cache()
    assert ours(prog, addrs) == {a: want[a] for a in addrs}
    assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (built + 1, asked + 5)
    assert symcache_path(tmp_path, prog).exists()
    LineTable.clear_cache()
    assert ours(prog, addrs) == {a: want[a] for a in addrs}
    assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (built + 1, asked + 5)


def test_without_aranges_the_symcache_answers(prog, tmp_path):
    """No .debug_aranges (clang's default): libdw could find no unit, so the
    file's SymCache is built and gives what the file with them gives."""
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy is not installed")
    bare = tmp_path / "inline-no-aranges"
    subprocess.run(["objcopy", "--remove-section=.debug_aranges", str(prog), str(bare)],
                   check=True)
    assert ".debug_aranges" not in ElfImage.open(str(bare)).section_names
    addrs = instructions(prog, {"outer", "main", "sink"})
    want = ours(prog, addrs)
    built, asked = LineTable.built_symcaches, LineTable.libdw_lookups
    assert ours(bare, addrs) == want
    assert (LineTable.built_symcaches, LineTable.libdw_lookups) == (built + 1, asked)


def test_pyelftools_answers_when_symbolic_cannot(prog, monkeypatch):
    """libdw and symbolic missing, or refusing the file: the same answers,
    unit by unit."""
    def refuse(path):
        raise symcache.SymCacheError("symbolic is not installed")
    monkeypatch.setattr(symcache, "build", refuse)
    monkeypatch.setattr(libdw, "available", lambda: False)
    addrs = instructions(prog, {"outer"})
    parsed = DwarfUnits.parsed_units
    assert ours(prog, addrs) == {a: c for a, c in
                                 addr2line_chains("eu-addr2line", prog, addrs).items()}
    assert DwarfUnits.parsed_units == parsed + 1


@pytest.mark.parametrize("plant", ["others-writable", "other-owner", "symlink"])
def test_untrusted_symcache_is_not_read(prog, tmp_path, plant, monkeypatch):
    """A cache file someone else could have written is ignored and replaced;
    a planted symlink is replaced, its target untouched."""
    monkeypatch.setattr(libdw, "available", lambda: False)    # the SymCache is built
    ret = call_returns(prog, "outer", "sink")[0]
    want = ours(prog, [ret - 1])
    cached = symcache_path(tmp_path, prog)
    good = cached.read_bytes()
    # a well-formed SymCache of another program: wrong names if believed
    other = build("chain", flags=O2_FP)
    LineTable.clear_cache()
    ours(other, [next(s.address for s in ElfImage.open(str(other)).find("main"))])
    forged = symcache_path(tmp_path, other).read_bytes()
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file")
    cached.unlink()
    if plant == "symlink":
        cached.symlink_to(victim)
    else:
        cached.write_bytes(forged)
        if plant == "others-writable":
            cached.chmod(0o666)
        else:
            os.chown(cached, 65534, 65534)
    LineTable.clear_cache()
    built = LineTable.built_symcaches
    assert ours(prog, [ret - 1]) == want
    assert LineTable.built_symcaches == built + 1
    assert not cached.is_symlink() and cached.read_bytes() == good
    assert victim.read_bytes() == b"root's file"


def test_corrupt_dwarf_gives_no_lines_and_a_message(prog, tmp_path, source):
    """.debug_line overwritten with garbage: no traceback, no wrong line."""
    bad = tmp_path / "bad"
    data = bytearray(prog.read_bytes())
    out = run("readelf", "-SW", str(prog))
    for name in (".debug_line", ".debug_info"):
        m = re.search(rf"\] {re.escape(name)}\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)", out)
        off, size = int(m.group(1), 16), int(m.group(2), 16)
        data[off:off + size] = bytes([0xFF]) * size
    bad.write_bytes(bytes(data))
    ret = call_returns(prog, "outer", "sink")[0]
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(bad), BASE)]}),
                     SymbolOptions(lines=True, inlines=True))
    (f,) = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    assert (f.function, f.line, f.inlined) == ("outer", 0, False)
    assert len(sym.warnings) == 1 and sym.warnings[0].startswith(f"{bad}: corrupt DWARF")


def libc_debug_file():
    if not os.path.isdir("/usr/lib/debug/.build-id"):
        pytest.skip("libc6-dbg is not installed (no /usr/lib/debug/.build-id)")
    found = debuginfo.find_debug_file(ElfImage.open(LIBC))
    if found.how != "build-id":
        pytest.skip("libc6-dbg does not match this libc (no debug file by build-id)")
    return found.path


def eu_chains(binary, addrs) -> dict:
    """addr2line_chains("eu-addr2line", …), completed where eu-addr2line
    itself stops short: at some addresses (libc's set_binding_values inlined
    into bind_textdomain_codeset) its -i loop prints nothing although its
    first line says "X inlined at FILE:LINE:COL in Y"; the caller (Y, FILE,
    LINE) is then taken from that line."""
    chains = addr2line_chains("eu-addr2line", binary, addrs)
    out = subprocess.run(["eu-addr2line", "-a", "-i", "-f", "-e", str(binary),
                          *(hex(a) for a in addrs)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    for i, line in enumerate(out):
        m = re.fullmatch(r"\S+ inlined at (.+):(\d+):\d+ in (\S+)", line)
        if m and re.fullmatch(r"0x[0-9a-f]+", out[i - 1]):
            chain = chains[int(out[i - 1], 16)]
            if len(chain) == 1:
                chain.append((m.group(3), m.group(1), int(m.group(2))))
    return chains


@pytest.mark.parametrize("inflater", ["libdeflate", "zlib"])
def test_libc_lines_agree_with_eu_addr2line(source, inflater, monkeypatch):
    """file:line and inlined calls (with their names) of 600 libc addresses
    through libc6-dbg, cold (libdw, or the SymCache built) and warm (read
    back). binutils 2.40 picks wrong file names in parts of libc's DWARF 5,
    so eu-addr2line is the oracle here. The real function's own name is the
    symbol table's (both tools name it from there, with different aliases),
    so it is left out. libdw reads Debian's compressed debug file from an
    image of its DWARF sections inflated in memory (by libdeflate, or zlib
    without it)."""
    if inflater == "zlib":
        monkeypatch.setattr(libdeflate, "available", lambda: False)
    elif not libdeflate.available():
        pytest.skip("libdeflate.so.0 is not installed (apt-get install libdeflate0)")
    debug = libc_debug_file()
    image = ElfImage.open(debug)
    funcs = [s for s in image.functions if s.size > 16]
    rnd = random.Random(4)
    addrs = sorted({s.address + rnd.randrange(s.size) for s in rnd.choices(funcs, k=600)})
    want = eu_chains(LIBC, addrs)
    images = LineTable.libdw_images
    got = cold_and_warm(debug, addrs, source)
    assert LineTable.libdw_images == images + (source == "libdw" and dwarf_image.wanted(image))
    assert [(a, got[a][:-1], got[a][-1][1:]) for a in addrs if got[a]] == \
        [(a, want[a][:-1], want[a][-1][1:]) for a in addrs if want[a]]
    assert sum(len(got[a]) > 1 for a in addrs) > 20      # inlined calls checked


def compressed_copy(prog, tmp_path):
    """`prog` with its .debug_* sections zlib-compressed (SHF_COMPRESSED),
    as Debian ships debug files."""
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy is not installed")
    out = tmp_path / "inline-z"
    subprocess.run(["objcopy", "--compress-debug-sections=zlib", str(prog), str(out)],
                   check=True)
    return out


def test_compressed_dwarf_read_from_an_inflated_image(prog, tmp_path):
    """A compressed debug file: libdw reads an image of its DWARF sections
    inflated in memory, and gives what eu-addr2line gives on the file. The
    image holds only the sections lines and inline scopes need, inflated
    (readelf on a copy written here)."""
    require_libdw()
    packed = compressed_copy(prog, tmp_path)
    image = ElfImage.open(str(packed))
    assert dwarf_image.wanted(image)
    addrs = instructions(prog, {"outer", "main", "sink"})
    want = addr2line_chains("eu-addr2line", packed, addrs)
    images = LineTable.libdw_images
    assert cold_and_warm(packed, addrs, "libdw") == want
    assert LineTable.libdw_images == images + 1
    copy = tmp_path / "image"
    copy.write_bytes(dwarf_image.build(image))
    out = run("readelf", "-SW", str(copy))
    names = set(re.findall(r"\] (\.\S+)", out))
    assert names == {".shstrtab"} | (set(dwarf_image.SECTIONS) & image.section_names)
    assert {".debug_info", ".debug_line", ".debug_aranges"} <= names
    assert not re.search(r"PROGBITS .* C ", out)                 # none compressed


def test_corrupt_compressed_dwarf_gives_no_lines_and_a_message(prog, tmp_path):
    """A compressed .debug_info whose stream is garbage: no image, libdw
    opens the file as before; no traceback, no wrong line."""
    require_libdw()
    packed = compressed_copy(prog, tmp_path)
    data = bytearray(packed.read_bytes())
    m = re.search(r"\] \.debug_info\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)",
                  run("readelf", "-SW", str(packed)))
    off, size = int(m.group(1), 16), int(m.group(2), 16)
    data[off + 24:off + size] = bytes([0xFF]) * (size - 24)    # after Elf64_Chdr
    packed.write_bytes(bytes(data))
    ret = call_returns(prog, "outer", "sink")[0]
    images = LineTable.libdw_images
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(packed), BASE)]}),
                     SymbolOptions(lines=True, inlines=True))
    (f,) = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    assert (f.function, f.line, f.inlined) == ("outer", 0, False)
    assert LineTable.libdw_images == images


def test_libc_lines_outside_dwarf_functions(source):
    """xdr_uint32_t has line rows but no DWARF function: libdw gives its
    line as eu-addr2line does; the SymCache knows only its symbol, and
    pyelftools gives the line."""
    debug = libc_debug_file()
    syms = ElfImage.open(debug).find("xdr_uint32_t")
    if not syms:
        pytest.skip("this libc has no xdr_uint32_t")
    addrs = [syms[0].address, syms[0].address + syms[0].size // 2]
    parsed = DwarfUnits.parsed_units
    want = eu_chains(LIBC, addrs)
    got = ours(debug, addrs)
    assert [got[a][-1][1:] for a in addrs] == [want[a][-1][1:] for a in addrs]
    assert DwarfUnits.parsed_units == parsed + (source == "symcache")


@pytest.mark.kernel
def test_trace_with_lines_and_inlines(prog):
    """End to end: a uprobe on sink, every frame with its line; the inlined
    frames as eu-addr2line lists them."""
    res = run_ustack("trace", f"uprobe:{prog}:sink", "-c", f"{prog} 1",
                     "--lines", "--inlines")
    assert res.returncode == 0, res.stderr
    frames = [l for l in res.stdout.splitlines() if l.startswith(" 0x")]
    rets = call_returns(prog, "outer", "sink")
    main_ret = call_returns(prog, "main", "outer")[0]
    sink = next(s.address for s in ElfImage.open(str(prog)).find("sink"))
    oracle = addr2line_chains("eu-addr2line", prog, [sink, rets[0] - 1, main_ret - 1])
    want = []
    for a, kinds in ((sink, ["sink+0x0/"]), (rets[0] - 1, ["inner (inlined)", "middle (inlined)", "outer+"]),
                     (main_ret - 1, ["main+"])):
        for (fn, file, line), kind in zip(oracle[a], kinds):
            want.append((kind, f"{file}:{line}"))
    got = [(l.split(" : ", 1)[1], l.rsplit(" ", 1)[1]) for l in frames[:5]]
    assert [(label[:len(kind)], where) for (label, where), (kind, _w) in zip(got, want)] \
        == want
    assert res.stdout.count(" (inlined) [inline] ") == 4     # two stacks, two each
