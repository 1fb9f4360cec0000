"""Separate debug files found like gdb finds them (build-id, .gnu_debuglink
with its CRC, MiniDebugInfo, --debug-dir), and refused when they do not
belong to the binary. Oracle: nm on the unstripped build."""
import lzma
import os
import shutil
import subprocess

import pytest

from helpers import O2_FP, build, FakeMaps, run, text_mapping

from ustack.objfile import debuginfo
from ustack.objfile.elf import ElfImage
from ustack.symbols.symbolizer import SymbolOptions, Symbolizer

CHAIN = ("d", "c", "b", "a", "main")
BASE = 0x555555554000


def nm_functions(path):
    out = {}
    for line in run("nm", "--defined-only", str(path)).splitlines():
        addr, kind, name = line.split(" ", 2)
        if kind in "tTwW":
            out[name] = int(addr, 16)
    return out


def objcopy(*args):
    if shutil.which("objcopy") is None:
        pytest.skip("objcopy is not installed")
    subprocess.run(["objcopy", *map(str, args)], check=True, capture_output=True)


@pytest.fixture
def chain(tmp_path, monkeypatch):
    """The chain program, its --only-keep-debug file, and a fully stripped
    copy (no .symtab: d..a are unnamed from the binary alone). The cache
    and the default debug root are the test's own."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(tmp_path / "usr-lib-debug")])
    ElfImage.clear_cache()
    full = build("chain", flags=O2_FP)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    debug = tmp_path / "chain.debug"
    objcopy("--only-keep-debug", full, debug)
    stripped = bindir / "chain"
    objcopy("--strip-all", f"--add-gnu-debuglink={debug}", full, stripped)
    return full, debug, stripped


def names(binary, extra_dirs=()):
    """Function names the Symbolizer gives d..main + 1 in `binary` (a copy
    of the chain build: the same addresses), and the refusals it reported."""
    addrs = nm_functions(build("chain", flags=O2_FP))
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(binary), BASE)]}),
                     SymbolOptions(debug_dirs=tuple(map(str, extra_dirs))))
    frames = sym.frames(1, [BASE + addrs[n] + 1 for n in CHAIN])
    return [f.function for f in frames], sym.warnings


def test_stripped_alone_has_no_names(chain):
    _full, _debug, stripped = chain
    got, warnings = names(stripped)
    assert got == [None] * 5 and warnings == []


@pytest.mark.parametrize("where", ["next to it", ".debug", "debug root"])
def test_debuglink_found_where_gdb_looks(chain, tmp_path, where):
    _full, debug, stripped = chain
    bindir = stripped.parent
    place = {"next to it": bindir / "chain.debug",
             ".debug": bindir / ".debug" / "chain.debug",
             "debug root": tmp_path / "usr-lib-debug" / str(bindir).lstrip("/") / "chain.debug",
             }[where]
    place.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(debug, place)
    got, warnings = names(stripped)
    assert got == list(CHAIN) and warnings == []
    lookup = debuginfo.find_debug_file(ElfImage.open(str(stripped)))
    assert (lookup.path, lookup.how) == (str(place), "debuglink")


def test_debug_dir_searched_like_usr_lib_debug(chain, tmp_path):
    full, debug, stripped = chain
    mine = tmp_path / "mine"
    # by build-id ...
    build_id = ElfImage.open(str(full)).build_id
    by_id = mine / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    by_id.parent.mkdir(parents=True)
    shutil.copy(debug, by_id)
    assert names(stripped) == ([None] * 5, [])           # not without --debug-dir
    assert names(stripped, [mine]) == (list(CHAIN), [])
    lookup = debuginfo.find_debug_file(ElfImage.open(str(stripped)), [str(mine)])
    assert (lookup.path, lookup.how) == (str(by_id), "build-id")
    # ... and by debuglink under DIR/<binary's directory>/
    shutil.rmtree(mine)
    linked = mine / str(stripped.parent).lstrip("/") / "chain.debug"
    linked.parent.mkdir(parents=True)
    shutil.copy(debug, linked)
    assert names(stripped, [mine]) == (list(CHAIN), [])


def other_debug_file(tmp_path, build_id=True):
    """The debug file of a different program (another build-id or none)."""
    flags = ("-O1", "-g") if build_id else ("-O1", "-g", "-Wl,--build-id=none")
    other = build("chain", flags=flags)
    out = tmp_path / f"other-{build_id}.debug"
    objcopy("--only-keep-debug", other, out)
    return out


def test_wrong_build_id_is_refused(chain, tmp_path):
    full, _debug, stripped = chain
    build_id = ElfImage.open(str(full)).build_id
    wrong = other_debug_file(tmp_path)
    mine = tmp_path / "mine"
    by_id = mine / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    by_id.parent.mkdir(parents=True)
    shutil.copy(wrong, by_id)
    got, warnings = names(stripped, [mine])
    assert got == [None] * 5          # no names rather than wrong names
    other_id = ElfImage.open(str(wrong)).build_id
    assert warnings == [f"{by_id}: build-id {other_id} does not match "
                        f"{stripped} ({build_id}); not used"]


def test_wrong_crc_is_refused(chain, tmp_path):
    _full, debug, stripped = chain
    place = stripped.parent / "chain.debug"
    # a file without build-id where the link points: only the CRC can tell
    shutil.copy(other_debug_file(tmp_path, build_id=False), place)
    got, warnings = names(stripped)
    assert got == [None] * 5
    want = debuginfo.file_crc32(str(debug))
    actual = debuginfo.file_crc32(str(place))
    assert actual != want
    assert warnings == [f"{place}: CRC {actual:08x} does not match the "
                        f".gnu_debuglink of {stripped} ({want:08x}); not used"]
    # the right file in .debug/ is still found after the refused one
    (stripped.parent / ".debug").mkdir()
    shutil.copy(debug, stripped.parent / ".debug" / "chain.debug")
    assert names(stripped)[0] == list(CHAIN)


def test_corrupt_debug_file_is_refused(chain, tmp_path):
    _full, debug, stripped = chain
    place = stripped.parent / "chain.debug"
    place.write_bytes(debug.read_bytes()[:300])      # truncated
    got, warnings = names(stripped)
    assert got == [None] * 5
    assert len(warnings) == 1 and warnings[0].startswith(f"{place}: corrupt ELF")


def minidebuginfo(full, tmp_path, payload=None):
    """A stripped copy of `full` with Fedora's MiniDebugInfo: .symtab of the
    functions .dynsym lacks, in an xz-compressed ELF in .gnu_debugdata."""
    mini = tmp_path / "mini.debug"
    objcopy("--only-keep-debug", full, mini)
    objcopy("--strip-debug", "--remove-section=.comment", mini)
    xz = tmp_path / "mini.debug.xz"
    xz.write_bytes(payload if payload is not None
                   else lzma.compress(mini.read_bytes(), format=lzma.FORMAT_XZ))
    out = tmp_path / "bin" / "chain-mini"
    objcopy("--strip-all", f"--add-section=.gnu_debugdata={xz}", full, out)
    return out


def test_minidebuginfo_names_stripped_functions(chain, tmp_path):
    full, _debug, _stripped = chain
    prog = minidebuginfo(full, tmp_path)
    assert not ElfImage.open(str(prog)).has_symtab
    got, warnings = names(prog)
    assert got == list(CHAIN) and warnings == []
    assert debuginfo.debug_lookup(ElfImage.open(str(prog)))[1].how == "minidebuginfo"
    # offsets and sizes as nm and readelf give them for the unstripped build
    addrs = nm_functions(full)
    sym = Symbolizer(FakeMaps({1: [text_mapping(str(prog), BASE)]}))
    f = sym.frames(1, [BASE + addrs["c"] + 7])[0]
    assert (f.function, f.offset, f.size) == (
        "c", 7, next(s.size for s in ElfImage.open(str(full)).find("c")))


def test_corrupt_minidebuginfo_is_refused(chain, tmp_path):
    full, _debug, _stripped = chain
    prog = minidebuginfo(full, tmp_path, payload=b"\xfd7zXZ\x00garbage" * 10)
    got, warnings = names(prog)
    assert got == [None] * 5
    assert len(warnings) == 1 and warnings[0].startswith(
        f"{prog}: corrupt .gnu_debugdata (")


@pytest.mark.skipif(not os.path.isdir("/usr/lib/debug/.build-id"),
                    reason="libc6-dbg is not installed (no /usr/lib/debug/.build-id)")
def test_libc_local_functions_named_from_libc6_dbg(monkeypatch):
    """new_do_write is static in libc: .dynsym cannot name it, the debug file can."""
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", ["/usr/lib/debug"])
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    found = debuginfo.find_debug_file(ElfImage.open(libc))
    debug = found.path if found.how == "build-id" else None
    if debug is None:
        pytest.skip("libc6-dbg does not match this libc (no debug file by build-id)")
    want = nm_functions(debug)["new_do_write"]
    alone = ElfImage.open(libc).lookup(want + 3)
    assert alone is None or alone.name != "new_do_write"
    sym = Symbolizer(FakeMaps({1: [text_mapping(libc, 0x7F0000000000)]}))
    f = sym.frames(1, [0x7F0000000000 + want + 3])[0]
    assert (f.function, f.offset, f.module) == ("new_do_write", 3, "libc.so.6")


@pytest.mark.kernel
def test_run_uses_debug_dir_and_reports_refusals(chain, tmp_path):
    """End to end: `count --debug-dir` names a stripped program's frames
    through the debug file; a mismatched one gives no names and one line
    on stderr saying why."""
    from helpers import run_ustack
    from helpers import ok, parse_counts, unnamed
    full, debug, stripped = chain
    build_id = ElfImage.open(str(full)).build_id
    mine = tmp_path / "mine"
    by_id = mine / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    by_id.parent.mkdir(parents=True)

    def run_count():
        res = ok(run_ustack("count", "syscall:write", "--debug-dir", mine,
                            "-c", f"{stripped} 3 write"))
        (stack,) = parse_counts(res.stdout)
        assert stack["count"] == 3, res.stdout
        return [f for f, m in stack["frames"] if m == "chain"], res.stderr

    shutil.copy(debug, by_id)
    got, err = run_count()
    assert got[:5] == list(CHAIN), got
    assert "ustack:" not in err, err

    shutil.copy(other_debug_file(tmp_path), by_id)
    got, err = run_count()
    assert all(unnamed(f) for f in got[:5]) and len(set(got[:5])) == 5, got
    other_id = ElfImage.open(str(by_id)).build_id
    refusal = (f"ustack: {by_id}: build-id {other_id} does not match "
               f"{stripped} ({build_id}); not used")
    assert err.splitlines().count(refusal) == 1, err


@pytest.mark.kernel
@pytest.mark.parametrize("variant, source", [
    ("unstripped", ".symtab"),
    ("debuglink", "debug file by debuglink"),
    ("build-id", "debug file by build-id"),
    ("minidebuginfo", "MiniDebugInfo (.gnu_debugdata)"),
    ("fully stripped", "FDE starts"),
])
def test_verbose_says_what_named_each_object(chain, tmp_path, variant, source):
    """-v: a line an object says where its frames' names came from."""
    from helpers import ok, run_ustack
    full, debug, stripped = chain
    extra = []
    prog = stripped
    if variant == "unstripped":
        prog = tmp_path / "bin" / "chain-full"
        shutil.copy(full, prog)
    elif variant == "debuglink":
        shutil.copy(debug, stripped.parent / "chain.debug")
    elif variant == "build-id":
        build_id = ElfImage.open(str(full)).build_id
        by_id = tmp_path / "mine" / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        by_id.parent.mkdir(parents=True)
        shutil.copy(debug, by_id)
        extra = ["--debug-dir", tmp_path / "mine"]
    elif variant == "minidebuginfo":
        prog = minidebuginfo(full, tmp_path)
    res = ok(run_ustack("count", "-v", "syscall:write", *extra, "-c", f"{prog} 3 write"))
    said = [line for line in res.stderr.splitlines() if line.startswith("ustack: names of ")]
    assert f"ustack: names of {prog}: {source}" in said, res.stderr
