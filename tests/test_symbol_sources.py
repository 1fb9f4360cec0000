"""The pieces Symbolizer dispatches to: normalizing a mapped address to
(object file, file offset), shared with the DWARF unwinder, and the kernel
source reading a kallsyms file (written here: its format is three columns,
and kptr_restrict shows every address as 0)."""
from __future__ import annotations

from ustack.model import Mapping
from ustack.objfile.mapped import file_offset, object_path
from ustack.objfile.vdso import vdso_path
from ustack.symbols.kernel import KERNEL_MODULE, KernelSymbols
from ustack.symbols.normalize import normalize
from ustack.symbols.symbolizer import Symbolizer

from helpers import FakeMaps


def test_object_path_of_files_vdso_and_anonymous_memory():
    lib = Mapping(0x1000, 0x3000, 0x2000, "/usr/lib/libx.so", host_path="/proc/7/root/usr/lib/libx.so")
    assert object_path(lib) == "/proc/7/root/usr/lib/libx.so"
    assert file_offset(lib, 0x1010) == 0x2010
    for path in ("//anon", "[heap]", "[anon:jit]", ""):
        assert object_path(Mapping(0x1000, 0x2000, 0, path)) is None
    vdso = Mapping(0x1000, 0x3000, 0, "[vdso]")
    assert object_path(vdso) == vdso_path(vdso)


def test_normalize_finds_the_mapping_and_offset():
    m = Mapping(0x400000, 0x401000, 0x1000, "/bin/true")
    maps = FakeMaps({5: [m]})
    assert normalize(maps, 5, 0x400123) == (m, "/bin/true", 0x1123)
    assert normalize(maps, 5, 0x500000) is None


def write_kallsyms(tmp_path, text: str) -> str:
    path = tmp_path / "kallsyms"
    path.write_text(text)
    return str(path)


def test_kernel_frames_from_kallsyms(tmp_path):
    path = write_kallsyms(tmp_path, "ffffffff81000000 T _stext\n"
                          "ffffffff81000100 t helper\n"
                          "ffffffff81000080 D some_data\n"
                          "ffffffff81000200 W weak_fn\t[mod]\n")
    ks = KernelSymbols(path)
    f = ks.frame(0xFFFFFFFF81000110)
    assert (f.module, f.function, f.offset, f.size) == (KERNEL_MODULE, "helper", 0x10, 0x100)
    last = ks.frame(0xFFFFFFFF81000208)
    assert (last.function, last.offset, last.size) == ("weak_fn", 8, 0)
    below = ks.frame(0x1000)
    assert (below.module, below.function) == (KERNEL_MODULE, None)


def test_kernel_frames_unnamed_when_addresses_are_hidden(tmp_path):
    path = write_kallsyms(tmp_path, "0000000000000000 T _stext\n0000000000000000 t helper\n")
    f = KernelSymbols(path).frame(0xFFFFFFFF81000110)
    assert (f.module, f.function) == (KERNEL_MODULE, None)
    assert KernelSymbols(str(tmp_path / "missing")).frame(5).function is None


def test_symbolizer_kernel_frames_use_kallsyms():
    with open("/proc/kallsyms") as f:
        first = next((l.split() for l in f if l.split()[1] in "tT"), None)
    frames = Symbolizer(FakeMaps({})).kernel_frames([int(first[0], 16)])
    assert [fr.module for fr in frames] == [KERNEL_MODULE]
    if int(first[0], 16):                        # names only when not hidden
        assert frames[0].function is not None
