"""dwz: debug files compressed with `dwz -m` (as Fedora and RHEL ship them)
keep the DWARF they share in an alt file named by .gnu_debugaltlink, and
refer to it with DW_FORM_GNU_strp_alt / DW_FORM_GNU_ref_alt. --lines and
--inlines must give what the uncompressed debug file gives."""
import shutil

import pytest

from helpers import (BASE, O2_FP, addr2line_chains, build, call_returns, FakeMaps,
                     instructions, ours, programs, require_libdw, run, run_ustack,
                     split_and_dwz, text_mapping)

from ustack.native import libdw
from ustack.objfile import debuginfo
from ustack.objfile.dwarf_lines import LineTable
from ustack.objfile.elf import ElfImage
from ustack.symbols.symbolizer import SymbolOptions, Symbolizer


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(tmp_path / "no-debug-root")])
    LineTable.clear_cache()
    ElfImage.clear_cache()


@pytest.mark.parametrize("reader", ["libdw", "pyelftools"])
@pytest.mark.parametrize("altlink", ["common.dwz", "absolute"])
def test_dwz_debug_file_gives_the_lines_of_the_uncompressed_one(tmp_path, altlink, reader,
                                                                 monkeypatch):
    if reader == "libdw":
        require_libdw()
    else:
        monkeypatch.setattr(libdw, "available", lambda: False)
    link = str(tmp_path / "common.dwz") if altlink == "absolute" else altlink
    prog, _stripped, debug = split_and_dwz(tmp_path, programs(), link)["inline"]
    # the test is of what it claims: names and DIEs did move to the alt file
    info = run("readelf", "--debug-dump=info", str(debug))
    assert "alt indirect string" in info and "<alt 0x" in info
    addrs = instructions(prog, {"outer", "main", "sink"})
    want = addr2line_chains("eu-addr2line", prog, addrs)
    assert ours(debug, addrs) == {a: want[a] for a in addrs}
    assert max(len(c) for c in want.values()) == 3      # inlined names from the alt file
    assert LineTable.for_image(ElfImage.open(str(debug))).errors == []


def test_dwz_stack_through_the_debuglink(tmp_path):
    """A stripped program whose debug file is dwz-compressed: the frames of
    a stack with --lines --inlines are those of the unstripped program."""
    prog, stripped, _debug = split_and_dwz(tmp_path, programs(), "common.dwz")["inline"]
    ret = call_returns(prog, "outer", "sink")[1]
    main_ret = call_returns(prog, "main", "outer")[0]

    def frames(path):
        sym = Symbolizer(FakeMaps({1: [text_mapping(str(path), BASE)]}),
                         SymbolOptions(lines=True, inlines=True))
        got = sym.frames(1, [BASE + ret, BASE + main_ret], leaf_is_exact=False)
        assert sym.warnings == []
        return [(f.function, f.file, f.line, f.inlined) for f in got]

    want = frames(prog)
    assert [(f[0], f[3]) for f in want] == [("inner", True), ("middle", True),
                                            ("outer", False), ("main", False)]
    assert frames(stripped) == want


def test_missing_alt_file_is_said_and_lines_stay(tmp_path):
    prog, stripped, _debug = split_and_dwz(tmp_path, programs(), "common.dwz")["inline"]
    (tmp_path / "common.dwz").unlink()
    ret = call_returns(prog, "outer", "sink")[1]
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(stripped), BASE)]}),
                     SymbolOptions(lines=True, inlines=True))
    got = sym.frames(1, [BASE + ret], leaf_is_exact=False)
    want = addr2line_chains("eu-addr2line", prog, [ret - 1])[ret - 1]
    # lines and the inline chain stay (only names kept in the alt file are lost)
    assert [(f.file, f.line, f.inlined) for f in got] == \
        [(file, line, inlined) for (_f, file, line), inlined in zip(want, (True, True, False))]
    assert len(sym.warnings) == 1 and sym.warnings[0].endswith(
        "dwz alt file common.dwz (build-id " + sym.warnings[0].split("(build-id ")[1])
    assert "not found; names it holds are missing" in sym.warnings[0]


def test_alt_file_of_another_build_is_refused(tmp_path):
    """An alt file at the linked path whose build-id is not the linked one
    (another dwz run) is not believed."""
    progs = split_and_dwz(tmp_path, programs(), "common.dwz")
    prog, _stripped, debug = progs["inline"]
    (tmp_path / "common.dwz").unlink()
    other = tmp_path / "other"
    other.mkdir()
    split_and_dwz(other, [build("recurse", flags=O2_FP), build("busy", flags=O2_FP)],
                  "common.dwz")
    shutil.copy(other / "common.dwz", tmp_path / "common.dwz")
    table = LineTable.for_image(ElfImage.open(str(debug)))
    assert table.errors[0].startswith(f"{tmp_path / 'common.dwz'}: build-id ")
    assert table.errors[0].endswith("; not used")


@pytest.mark.kernel
def test_trace_lines_inlines_with_a_dwz_debug_file(tmp_path):
    """End to end: `ustack trace --lines --inlines` of the stripped program
    prints the frames the unstripped one gives."""
    progs = split_and_dwz(tmp_path, programs(), "common.dwz")
    prog, stripped, _debug = progs["inline"]

    def stacks(path):
        res = run_ustack("trace", f"uprobe:{path}:sink", "-c", f"{path} 1",
                         "--lines", "--inlines")
        assert res.returncode == 0, res.stderr
        return [line.split(" : ", 1)[1] for line in res.stdout.splitlines()
                if line.startswith(" 0x")], res.stderr

    want, _ = stacks(prog)
    got, err = stacks(stripped)
    assert " (inlined) " in "\n".join(want)
    assert got == [w.replace(str(prog), str(stripped)) for w in want], err
