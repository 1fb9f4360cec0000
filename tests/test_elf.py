"""ElfImage and Symbolizer against real gcc/go output, with readelf as the
oracle; each test twice: the ELF read through libelf, and through
pyelftools (what ustack does without libelf.so.1)."""
import os
import random
import re
import shutil

import pytest

from helpers import FP, build, build_go_source, FakeMaps, readelf_loads, run, text_mapping

from ustack.native import libelf
from ustack.model import Mapping, UstackError
from ustack.objfile.elf import ElfImage, Symbol
from ustack.symbols.symbolizer import Symbolizer

SRC = r"""
#include <stdlib.h>
int counter = 7;                 /* .data: RW segment, vaddr != file offset */
static char big[1 << 16];        /* .bss: no bytes in the file */
__attribute__((noinline)) static int local_impl(int x) { return x * 3 + counter; }
int global_alias(int x) __attribute__((alias("local_impl")));
/* like glibc: __getpid global, getpid a weak alias */
__attribute__((noinline)) int __impl2(int x) { return x - counter; }
int pub2(int x) __attribute__((weak, alias("__impl2")));
/* like glibc's __memcpy_avx512_unaligned_erms and __memmove_...: local
 * names alike, as many underscores */
__attribute__((noinline, used)) static int copy_impl(int x) { return x * 5 - counter; }
static int cp(int x) __attribute__((alias("copy_impl"), used));
static int move_longest(int x) __attribute__((alias("copy_impl"), used));
__attribute__((noinline)) int leaf(int x) {
    int s = 0;
    for (int i = 0; i < x; i++) s += counter * i + big[i & 1023];
    return s;
}
__attribute__((noinline)) void fatal(void) { abort(); }
asm(".text\n"
    /* a call that is the last instruction: its return address is `other` */
    ".globl tailcaller\n.type tailcaller,@function\ntailcaller: call other\n"
    ".size tailcaller,.-tailcaller\n"
    ".globl other\n.type other,@function\nother: ret\n.size other,.-other\n"
    /* names that are also globs */
    ".globl \"a*b\"\n.type \"a*b\",@function\n\"a*b\": ret\n.size \"a*b\",1\n"
    ".globl aXb\n.type aXb,@function\naXb: ret\n.size aXb,1\n"
    /* no .size, alone in its section: sized up to the section end */
    ".section zzsec,\"ax\",@progbits\n"
    ".globl nosize\n.type nosize,@function\nnosize: nop\nnop\nret\n.text\n");
int main(int argc, char **argv) {
    big[argc] = 1;
    if (argc > 50) fatal();
    return leaf(argc) + global_alias(argc) + pub2(argc) + cp(argc) + move_longest(argc);
}
"""

PIE_BASE = 0x555555554000


# --- helpers: compile, and read the oracle (binutils) ------------------------


def cc(tmp_path, name, src, *flags):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    c = tmp_path / f"{name}.c"
    c.write_text(src)
    out = tmp_path / name
    run("gcc", *flags, "-o", str(out), str(c))
    return str(out)


def readelf_functions(path, table="-s"):
    """{(name, address, size)} of defined FUNC/IFUNC symbols."""
    out = set()
    for line in run("readelf", "-W", table, path).splitlines():
        f = line.split()
        if (len(f) >= 8 and f[0].endswith(":") and f[3] in ("FUNC", "IFUNC")
                and f[6] != "UND" and int(f[1], 16)):
            out.add((f[7].split("@")[0], int(f[1], 16), int(f[2], 0)))
    return out


def readelf_symbol(path, name):
    for n, addr, size in readelf_functions(path):
        if n == name:
            return addr, size
    raise KeyError(name)


def nm_address(path, name):
    for line in run("nm", "--defined-only", path).splitlines():
        addr, _kind, n = line.split(" ", 2)
        if n == name:
            return int(addr, 16)
    raise KeyError(name)


def readelf_section(path, name):
    """(addr, offset, size) of a section."""
    for line in run("readelf", "-SW", path).splitlines():
        m = re.search(r"\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", line)
        if m and m.group(1) == name:
            return tuple(int(m.group(i), 16) for i in (2, 3, 4))
    raise KeyError(name)


@pytest.fixture(autouse=True, params=["libelf", "pyelftools"])
def reader(request, tmp_path, monkeypatch):
    """Which library reads the ELF files: a cache of its own, so that each
    parses them."""
    if request.param == "pyelftools":
        monkeypatch.setattr(libelf, "available", lambda: False)
    elif not libelf.available():
        pytest.skip("libelf.so.1 is not installed (apt-get install libelf1)")
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    ElfImage.clear_cache()
    return request.param


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    d = tmp_path_factory.mktemp("elf")
    return {
        "pie": cc(d, "pie", SRC, "-O1", "-fPIE", "-pie"),
        "nopie": cc(d, "nopie", SRC, "-O1", "-no-pie"),
        "so": cc(d, "lib.so", SRC, "-O1", "-shared", "-fPIC"),
    }


# --- symbols ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pie", "nopie", "so"])
def test_functions_match_readelf(bins, kind):
    img = ElfImage.open(bins[kind])
    expected = {s for s in readelf_functions(bins[kind]) if s[2] > 0}
    got = {(s.name, s.address, s.size) for s in img.functions}
    assert expected <= got
    # every extra one is a zero-size symbol we gave a size to
    zero = {(n, a) for n, a, s in readelf_functions(bins[kind]) if s == 0}
    assert {(n, a) for n, a, _ in got - expected} <= zero
    # no duplicates although .symtab and .dynsym repeat each other (.so)
    keys = [(s.name, s.address) for s in img.functions]
    assert len(keys) == len(set(keys))
    assert [s.address for s in img.functions] == sorted(s.address for s in img.functions)
    assert all(isinstance(s, Symbol) for s in img.functions)


def test_dynsym_only_after_strip(bins, tmp_path):
    stripped = str(tmp_path / "stripped.so")
    run("strip", "--strip-all", "-o", stripped, bins["so"])
    img = ElfImage.open(stripped)
    names = {s.name for s in img.functions}
    assert {"leaf", "global_alias", "main", "tailcaller"} <= names
    assert "local_impl" not in names  # static: only in .symtab
    assert not img.has_symtab
    assert names == {n for n, _a, _s in readelf_functions(stripped, "--dyn-syms")}


def test_zero_size_symbol_capped_at_section_end(bins):
    img = ElfImage.open(bins["pie"])
    addr, size = readelf_symbol(bins["pie"], "nosize")
    assert size == 0
    sec_addr, _off, sec_size = readelf_section(bins["pie"], "zzsec")
    assert sec_addr == addr
    (sym,) = img.find("nosize")
    assert sym == Symbol("nosize", addr, sec_size) and sec_size == 3
    assert img.lookup(addr + 2) == sym
    assert img.lookup(addr + 3) != sym


@pytest.mark.parametrize("kind", ["pie", "nopie", "so"])
def test_lookup_every_function(bins, kind):
    img = ElfImage.open(bins[kind])
    for name, addr, size in readelf_functions(bins[kind]):
        if size == 0 or name == "local_impl":
            continue
        for a in (addr, addr + size // 2, addr + size - 1):
            assert img.lookup(a).address == addr, (name, hex(a))
        after = img.lookup(addr + size)
        assert after is None or after.address == addr + size


def test_lookup_prefers_global_alias(bins):
    img = ElfImage.open(bins["pie"])
    addr = nm_address(bins["pie"], "local_impl")
    assert nm_address(bins["pie"], "global_alias") == addr
    assert {s.name for s in img.functions if s.address == addr} == {"local_impl", "global_alias"}
    assert img.lookup(addr).name == "global_alias"
    assert img.lookup(addr + 1).name == "global_alias"
    addr = nm_address(bins["pie"], "__impl2")
    assert nm_address(bins["pie"], "pub2") == addr
    assert img.lookup(addr).name == "pub2"


def test_lookup_of_equal_aliases_names_the_longest_as_perf(bins):
    """Of local aliases alike in all else, perf names the longest (its
    choose_best_symbol): glibc's __memmove_avx512_unaligned_erms over
    __memcpy_..., which share their code; ustack names it the same."""
    img = ElfImage.open(bins["pie"])
    addr = nm_address(bins["pie"], "cp")
    assert nm_address(bins["pie"], "move_longest") == addr
    assert img.lookup(addr).name == "move_longest"


def test_flatten_nested_and_overlapping_ranges():
    # glibc's assembly has symbols inside and across others
    from ustack.objfile.elf import flatten_ranges
    outer, inner = Symbol("outer", 0x100, 0x100), Symbol("inner", 0x150, 0x10)
    cross, after = Symbol("cross", 0x1F0, 0x20), Symbol("after", 0x300, 0x8)
    starts, owners = flatten_ranges([outer, inner, cross, after])
    import bisect

    def at(a):
        i = bisect.bisect_right(starts, a) - 1
        return owners[i].name if i >= 0 and owners[i] else None

    assert [at(a) for a in (0xFF, 0x100, 0x14F, 0x150, 0x15F, 0x160, 0x1EF, 0x1F0,
                            0x20F, 0x210, 0x300, 0x308)] == [
        None, "outer", "outer", "inner", "inner", "outer", "outer", "cross",
        "cross", None, "after", None]


def test_lookup_outside_functions(bins):
    img = ElfImage.open(bins["pie"])
    assert img.lookup(0) is None
    assert img.lookup(nm_address(bins["pie"], "counter")) is None
    assert img.lookup(1 << 60) is None


def test_find_and_match(bins):
    img = ElfImage.open(bins["pie"])
    assert [s.name for s in img.find("leaf")] == ["leaf"]
    assert img.find("lea") == []
    assert {s.name for s in img.match("l*")} == {"leaf", "local_impl"}
    # a literal name wins over its reading as a glob
    assert [s.name for s in img.match("a*b")] == ["a*b"]
    assert {s.name for s in img.match("a?b")} == {"a*b", "aXb"}
    assert img.match("zz*") == []


def objdump_plt_stubs(path):
    """{address: 'name@plt'} as objdump labels the PLT sections' stubs."""
    out = {}
    for line in run("objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got",
                    path).splitlines():
        m = re.match(r"([0-9a-f]+) <([^>+]+@plt)>:", line)
        if m:
            out[int(m.group(1), 16)] = m.group(2)
    return out


@pytest.mark.parametrize("flags", [(), ("-fcf-protection=full",), ("-Wl,-z,now",)],
                         ids=["lazy", "ibt", "now"])
def test_plt_stubs_named_like_objdump(tmp_path, flags):
    path = cc(tmp_path, "plt", SRC, "-O1", *flags)
    want = objdump_plt_stubs(path)
    assert "abort@plt" in want.values(), want
    img = ElfImage.open(path)
    for addr, name in want.items():
        assert img.lookup(addr).name == name
        assert img.lookup(addr + 5).name == name     # inside the stub too
    # stubs name addresses; they are neither probe targets nor list rows
    assert not [s for s in img.functions if s.name.endswith("@plt")]
    assert img.find("abort@plt") == []


LABELS_SRC = r"""
asm(".text\n"
    /* an untyped entry point in no function (like ld.so's _start) */
    ".globl entry_label\nentry_label: nop\nnop\n"
    /* a typed function with a label inside it: the label must not rename it */
    ".globl sized\n.type sized,@function\nsized: nop\ninner_label: nop\nret\n"
    ".size sized,.-sized\n");
int main(void) { return 0; }
"""


def test_code_labels_name_only_gaps(tmp_path):
    path = cc(tmp_path, "labels", LABELS_SRC, "-O1")
    img = ElfImage.open(path)
    entry, inner, sized = (nm_address(path, n)
                           for n in ("entry_label", "inner_label", "sized"))
    assert img.lookup(entry).name == "entry_label"
    assert img.lookup(entry + 1).name == "entry_label"
    assert img.lookup(inner).name == "sized"
    assert img.lookup(sized + 2).name == "sized"
    # labels name addresses; they are neither probe targets nor list rows
    assert img.find("entry_label") == [] and img.find("sized")


# --- addresses, file offsets, bytes ------------------------------------------

@pytest.mark.parametrize("kind", ["pie", "nopie", "so"])
def test_file_offsets_from_program_headers(bins, kind):
    path = bins[kind]
    img = ElfImage.open(path)
    loads = readelf_loads(path)
    for name in ("main", "leaf", "counter"):
        vaddr = nm_address(path, name)
        (off, seg_vaddr, *_rest) = [l for l in loads if l[1] <= vaddr < l[1] + l[2]][0]
        assert img.file_offset(vaddr) == vaddr - seg_vaddr + off
        assert img.vaddr_of_file_offset(vaddr - seg_vaddr + off) == vaddr
    # .data is where vaddr and offset differ even in a PIE
    data = nm_address(path, "counter")
    assert img.file_offset(data) != data - (0x400000 if kind == "nopie" else 0)
    # .bss has no file bytes; far addresses are in no segment
    bss_end = max(l[1] + l[3] for l in loads)
    assert img.file_offset(bss_end - 1) is None
    assert img.file_offset(1 << 50) is None
    assert img.vaddr_of_file_offset(os.path.getsize(path) + 10) is None


def test_nopie_text_is_not_at_its_file_offset(bins):
    img = ElfImage.open(bins["nopie"])
    main = nm_address(bins["nopie"], "main")
    assert main > 0x400000 and img.file_offset(main) == main - 0x400000
    assert img.executable(main) and not img.executable(nm_address(bins["nopie"], "counter"))


def test_read_matches_objcopy(bins, tmp_path):
    path = bins["nopie"]
    text = tmp_path / "text.bin"
    run("objcopy", "-O", "binary", "--only-section=.text", path, str(text))
    text_addr = readelf_section(path, ".text")[0]
    addr, size = readelf_symbol(path, "leaf")
    raw = text.read_bytes()
    assert ElfImage.open(path).read(addr, size) == raw[addr - text_addr: addr - text_addr + size]
    assert ElfImage.open(path).read(1 << 50, 4) == b""


def test_reads_share_one_descriptor(bins):
    """read() keeps one descriptor per image instead of opening per call."""
    img = ElfImage.open(bins["pie"])
    leaf = img.find("leaf")[0].address

    def open_on_it():
        return [fd for fd in os.listdir("/proc/self/fd") if os.path.realpath(
            f"/proc/self/fd/{fd}") == os.path.realpath(bins["pie"])]
    before = open_on_it()       # images of earlier tests keep theirs
    img.read(leaf, 4)
    held = open_on_it()
    assert len(held) == len(before) + 1
    for _ in range(50):
        img.read(leaf, 4)
    assert open_on_it() == held


def test_section_bytes_match_pyelftools(tmp_path):
    """section_bytes() gives what pyelftools' data() does, compressed
    (gcc -gz: SHF_COMPRESSED zlib) debug sections inflated."""
    from elftools.elf.elffile import ELFFile
    path = cc(tmp_path, "gz", SRC, "-O1", "-g", "-gz=zlib")
    img = ElfImage.open(path)
    with open(path, "rb") as f:
        sections = list(ELFFile(f).iter_sections())
        want = {s.name: s.data() for s in sections
                if s["sh_type"] != "SHT_NOBITS" and s.name}
    SHF_COMPRESSED = 0x800
    assert any(s.name.startswith(".debug_") and s["sh_flags"] & SHF_COMPRESSED
               for s in sections), "gcc -gz compressed nothing"
    assert {name: img.section_bytes(name) for name in want} == want
    assert img.section_bytes(".no_such_section") is None


def test_header_facts(bins, tmp_path):
    pie, nopie, so = (ElfImage.open(bins[k]) for k in ("pie", "nopie", "so"))
    assert (pie.e_type, pie.is_pie, pie.machine) == ("ET_DYN", True, "EM_X86_64")
    assert (nopie.e_type, nopie.is_pie) == ("ET_EXEC", False)
    assert so.e_type == "ET_DYN" and not pie.is_go
    note = run("readelf", "-n", bins["pie"])
    assert pie.build_id == re.search(r"Build ID: ([0-9a-f]+)", note).group(1)
    assert pie.path == bins["pie"]
    noid = cc(tmp_path, "noid", SRC, "-Wl,--build-id=none")
    assert ElfImage.open(noid).build_id is None


def test_build_id_without_section_headers(bins, tmp_path):
    # drop the section header table: the build-id must come from PT_NOTE
    data = bytearray(open(bins["pie"], "rb").read())
    data[0x28:0x30] = bytes(8)   # e_shoff
    data[0x3C:0x40] = bytes(4)   # e_shnum, e_shstrndx
    p = tmp_path / "nosections"
    p.write_bytes(bytes(data))
    img = ElfImage.open(str(p))
    assert img.build_id == ElfImage.open(bins["pie"]).build_id
    assert img.functions == []


def test_open_is_cached_per_file_identity(bins, tmp_path):
    p = tmp_path / "copy"
    shutil.copy(bins["pie"], p)
    a = ElfImage.open(str(p))
    assert ElfImage.open(str(p)) is a
    os.utime(p, ns=(1, 1))
    assert ElfImage.open(str(p)) is not a


# --- errors ----------------------------------------------------------------

def test_open_errors(bins, tmp_path):
    with pytest.raises(UstackError, match=r"^no such binary: /nonexistent/x$"):
        ElfImage.open("/nonexistent/x")
    text = tmp_path / "text"
    text.write_text("#!/bin/sh\necho hi\n")
    with pytest.raises(UstackError, match=rf"^{text}: not an ELF file$"):
        ElfImage.open(str(text))
    full = open(bins["pie"], "rb").read()
    for n in (20, 100, 3000):
        t = tmp_path / f"trunc{n}"
        t.write_bytes(full[:n])
        with pytest.raises(UstackError, match=rf"^{t}: corrupt ELF: \S"):
            ElfImage.open(str(t))
    bad = bytearray(full)
    bad[0x28:0x30] = (0xFFFFFFF).to_bytes(8, "little")  # e_shoff past EOF
    b = tmp_path / "badshoff"
    b.write_bytes(bytes(bad))
    with pytest.raises(UstackError, match=rf"^{b}: corrupt ELF: .*\n?$"):
        ElfImage.open(str(b))


def test_corrupt_files_only_raise_ustack_errors(bins, tmp_path):
    full = open(bins["so"], "rb").read()
    shoff = int.from_bytes(full[0x28:0x30], "little")
    rng = random.Random(1234)
    outcomes = set()
    for i in range(150):
        data = bytearray(full)
        for _ in range(rng.randint(1, 8)):
            region = rng.choice([(0, 0x40), (0x40, 0x400), (shoff, len(full))])
            data[rng.randrange(*region)] = rng.randrange(256)
        if i % 5 == 0:
            data = data[: rng.randrange(len(data))]
        p = tmp_path / f"m{i}"
        p.write_bytes(bytes(data))
        try:
            img = ElfImage.open(str(p))
            img.lookup(0x1100), img.file_offset(0x1100), img.match("*a*")
            outcomes.add("ok")
        except UstackError as e:
            assert str(e).startswith(str(p)) and "\n" not in str(e)
            outcomes.add("error")
    assert outcomes == {"ok", "error"}


# --- Go --------------------------------------------------------------------

GO_SRC = """package main

import "os"

type T struct{ n int }

//go:noinline
func (t *T) Method(x int) int { return t.n*x + len(os.Args) }

func main() { os.Exit((&T{3}).Method(2) & 0) }
"""


@pytest.fixture(scope="module")
def gobin(tmp_path_factory):
    d = tmp_path_factory.mktemp("go")
    return (build_go_source(d, GO_SRC),
            build_go_source(d, GO_SRC, "stripped", ldflags="-s -w"))


def test_go_names(gobin):
    prog, stripped = gobin
    img = ElfImage.open(prog)
    assert img.is_go and ElfImage.open(stripped).is_go
    addr, size = readelf_symbol(prog, "main.(*T).Method")
    assert img.match("main.(*T).Method") == [Symbol("main.(*T).Method", addr, size)]
    assert img.lookup(addr + size - 1).name == "main.(*T).Method"
    assert {"main.main", "main.(*T).Method"} <= {s.name for s in img.match("main.*")}
    # -s -w drops .symtab, not .gopclntab: the same functions, at the same
    # addresses (sized up to the next function: the table counts the padding)
    bare = ElfImage.open(stripped)
    (sym,) = bare.find("main.(*T).Method")
    assert (sym.name, sym.address) == ("main.(*T).Method", addr) and sym.size >= size
    assert bare.lookup(addr + size - 1).name == "main.(*T).Method"
    go_names = {s.name for s in img.functions if s.name.startswith("main.")}
    assert {s.name for s in bare.match("main.*")} == go_names


# --- Symbolizer ------------------------------------------------------------


def test_symbolizer_pie_slid(bins):
    path = bins["pie"]
    m = text_mapping(path, PIE_BASE)
    sym = Symbolizer(FakeMaps({7: [m]}))
    leaf, leaf_size = readelf_symbol(path, "leaf")
    tail, tail_size = readelf_symbol(path, "tailcaller")
    other = nm_address(path, "other")
    assert tail_size == 5 and other == tail + 5
    ret = PIE_BASE + other  # return address of the call ending `tailcaller`
    frames = sym.frames(7, [PIE_BASE + leaf + 2, ret, ret])
    assert [(f.function, f.offset) for f in frames] == [
        ("leaf", 2), ("tailcaller", 5), ("tailcaller", 5)]
    f = frames[0]
    assert (f.addr, f.module, f.path, f.size) == (PIE_BASE + leaf + 2, "pie", path, leaf_size)
    # gcc ends `fatal` with `call abort`: its return address starts `main`
    fatal, fatal_size = readelf_symbol(path, "fatal")
    if nm_address(path, "main") == fatal + fatal_size:
        f = sym.frames(7, [PIE_BASE + leaf, PIE_BASE + fatal + fatal_size])[1]
        assert (f.function, f.offset) == ("fatal", fatal_size)
    # the innermost frame is exact unless told otherwise
    assert sym.frames(7, [ret])[0].function == "other"
    assert sym.frames(7, [ret], leaf_is_exact=False)[0].function == "tailcaller"
    # cached answers still give each address its own offset
    assert sym.frames(7, [PIE_BASE + leaf + 1])[0].offset == 1


def test_symbolizer_two_processes_and_nopie(bins):
    pie, nopie = bins["pie"], bins["nopie"]
    base2 = 0x7F0000000000
    maps = FakeMaps({1: [text_mapping(pie, PIE_BASE)],
                     2: [text_mapping(pie, base2), text_mapping(nopie, 0)]})
    sym = Symbolizer(maps)
    leaf = nm_address(pie, "leaf")
    assert sym.frames(1, [PIE_BASE + leaf + 3])[0].offset == 3
    f = sym.frames(2, [base2 + leaf + 4])[0]
    assert (f.function, f.offset) == ("leaf", 4)
    main = nm_address(nopie, "main")
    f = sym.frames(2, [main])[0]
    assert (f.function, f.offset, f.module) == ("main", 0, "nopie")


def test_symbolizer_shared_library(bins):
    so = bins["so"]
    base = 0x7F1234560000
    sym = Symbolizer(FakeMaps({3: [text_mapping(so, base)]}))
    addr, size = readelf_symbol(so, "leaf")
    f = sym.frames(3, [base + addr + size - 1])[0]
    assert (f.function, f.offset, f.module, f.size) == ("leaf", size - 1, "lib.so", size)


def test_symbolizer_unknowns(bins, tmp_path):
    pie = bins["pie"]
    gone = str(tmp_path / "deleted-binary")
    maps = FakeMaps({5: [
        Mapping(0x1000, 0x2000, 0, "[vdso]"),
        Mapping(0x3000, 0x4000, 0, gone),
        Mapping(0x5000, 0x6000, 0, "/not/elf", host_path=__file__),
        text_mapping(pie, PIE_BASE),
    ]})
    sym = Symbolizer(maps)
    frames = sym.frames(5, [0x1010, 0x3010, 0x5010, 0x9999])
    assert [(f.module, f.function, f.path) for f in frames] == [
        ("vdso", None, "[vdso]"), ("deleted-binary", None, gone),
        ("elf", None, "/not/elf"), ("", None, "")]
    assert frames[3].addr == 0x9999
    # in the mapped code but in no function (the PLT has no symbols): kept
    # by its place in the object, from the start its CFI gives
    plt = readelf_section(pie, ".plt")[0]
    f = sym.frames(5, [PIE_BASE + plt + 2])[0]
    assert (f.function, f.module, f.objaddr) == (None, "pie", plt + 2)
    assert 0 < f.objstart <= plt + 2 and f.offset == plt + 2 - f.objstart


# --- the symbol cache (by build-id) --------------------------------------------

def test_symbols_come_back_from_the_cache(bins, tmp_path, monkeypatch):
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    copy = str(tmp_path / "lib.so")
    shutil.copy(bins["so"], copy)
    first = ElfImage.open(copy).functions
    assert len(list((tmp_path / "cache" / "symbols").glob("*.json"))) == 1
    ElfImage.clear_cache()

    def no_parsing(reader):
        raise AssertionError("symbols parsed again despite the cache")
    from ustack.objfile import elf_symtab
    monkeypatch.setattr(elf_symtab, "_raw_functions", no_parsing)
    assert ElfImage.open(copy).functions == first


def test_stripped_copy_does_not_reuse_the_full_symbols(bins, tmp_path, monkeypatch):
    """Same build-id, other symbol tables: each gets its own cache entry."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    ElfImage.clear_cache()
    stripped = str(tmp_path / "stripped.so")
    run("strip", "--strip-all", "-o", stripped, bins["so"])
    full = {s.name for s in ElfImage.open(bins["so"]).functions}
    ElfImage.clear_cache()
    img = ElfImage.open(stripped)
    assert img.build_id == ElfImage.open(bins["so"]).build_id
    names = {s.name for s in img.functions}
    assert names == {n for n, _a, _s in readelf_functions(stripped, "--dyn-syms")}
    assert names < full
    assert len(list((tmp_path / "cache" / "symbols").glob("*.json"))) == 2


def test_corrupt_symbol_cache_is_rebuilt(bins, tmp_path, monkeypatch):
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    ElfImage.clear_cache()
    want = ElfImage.open(bins["so"]).functions
    ElfImage.clear_cache()
    entries = list((tmp_path / "cache" / "symbols").glob("*.json"))
    assert len(entries) == 1
    entries[0].write_bytes(b"{not json")
    assert ElfImage.open(bins["so"]).functions == want


def test_symbol_addresses_by_name_as_the_function_index_gives_them():
    """objfile/symbol_by_name: through the GNU hash (libc's exports), a
    table scan (a PIE program's main, in .symtab only), and nothing
    for a name the file does not define."""
    from ustack.objfile import symbol_by_name
    libc = ElfImage.open("/lib/x86_64-linux-gnu/libc.so.6")
    found = symbol_by_name.addresses(libc.file, ("malloc", "getpid", "no_such_name"))
    assert found == {name: libc.find(name)[0].address for name in ("malloc", "getpid")}
    prog = ElfImage.open(str(build("chain", flags=FP)))
    assert symbol_by_name.addresses(prog.file, ("main",)) == {"main": prog.find("main")[0].address}


def test_headers_read_without_libelf_are_libelfs(bins):
    """objfile.elf_headers (OnDisk's reader, no libelf to load) gives what
    libelf gives: segments, sections with their names, build-id; a file
    it does not read whole (cut short) is left to libelf."""
    from ustack.objfile.elf_headers import read_headers
    from ustack.objfile.elf_reader import open_reader
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    for path in [libc, *bins.values()]:
        with open(path, "rb") as f:
            ours, theirs = read_headers(f), open_reader(path, f)
            assert ours is not None, path
            assert [tuple(s) for s in ours.segments] == [tuple(s) for s in theirs.segments]
            assert [tuple(s) for s in ours.sections] == [tuple(s) for s in theirs.sections]
            assert ours.build_id() == theirs.build_id() and ours.build_id(), path
            theirs.close()


def test_headers_of_a_cut_file_are_left_to_libelf(bins, tmp_path):
    cut = tmp_path / "cut"
    data = open(bins["pie"], "rb").read()
    cut.write_bytes(data[:len(data) - 100])     # the section headers end the file
    from ustack.objfile.elf_headers import read_headers
    with open(cut, "rb") as f:
        assert read_headers(f) is None
