"""The BPF objects that ship are built from their C, and the loader in
kernel/bpf_object.py places what clang leaves to it: maps declared in C,
.rodata set at load, .bss, bpf-to-bpf calls, bpf_loop callbacks, and the
C source line in the verifier's refusal."""
import os
import shutil
import subprocess

import pytest

from ustack.bpf import build, object_path
from ustack.kernel import bpf_syscall
from ustack.kernel.bpf_object import BpfObject, bpf_object
from helpers import PROGRAMS


def _clang() -> None:
    if shutil.which("clang") is None or shutil.which("llvm-strip") is None:
        pytest.skip("clang and llvm are not installed (apt-get install clang llvm "
                    "libbpf-dev): the objects cannot be rebuilt")


def test_committed_objects_match_their_c():
    _clang()
    assert build.check() == []


@pytest.fixture(scope="module")
def check_object(tmp_path_factory):
    """tests/programs/bpf/loader_check.bpf.c, built as ustack's objects are."""
    _clang()
    out = tmp_path_factory.mktemp("bpf") / "loader_check.bpf.o"
    src = PROGRAMS / "bpf" / "loader_check.bpf.c"
    subprocess.run(["clang", *build.CLANG_FLAGS, f"-I{build.HERE}", "-c", str(src),
                    "-o", str(out)], check=True)
    return BpfObject(str(out))


def test_calls_callbacks_rodata_and_bss_run_in_the_kernel(check_object):
    maps = {}
    fd = check_object.load("loader_check", maps, {"factor": 7})
    try:
        # scaled(5) = twice(5) * 7 = 70 (bpf-to-bpf calls, one reading
        # .rodata), loops = 6 (a bpf_loop callback writing .bss)
        assert bpf_syscall.test_run(fd, (5).to_bytes(8, "little")) == 76
        assert maps["out"].lookup((1).to_bytes(4, "little")) == (70).to_bytes(8, "little")
        assert maps[".bss"].lookup(bytes(4)) == (6).to_bytes(8, "little")
    finally:
        os.close(fd)
        for m in maps.values():
            m.close()


def test_a_program_gets_the_functions_it_reaches_and_their_maps_alone(check_object):
    """counted() and the map it alone names come with lonely, the program
    that calls it, not with loader_check, which never reaches it (though
    it sits between two functions loader_check calls)."""
    for program, expected in (("loader_check", 76), ("lonely", 3)):
        maps = {}
        fd = check_object.load(program, maps, {"factor": 7})
        try:
            assert bpf_syscall.test_run(fd, (5).to_bytes(8, "little")) == expected
            assert ("unreached" in maps) == (program == "lonely"), sorted(maps)
        finally:
            os.close(fd)
            for m in maps.values():
                m.close()


def test_a_refusal_shows_the_c_line(check_object):
    maps = {}
    with pytest.raises(bpf_syscall.LoadError) as e:
        check_object.load("refused", maps)
    for m in maps.values():
        m.close()
    assert "return v[ctx ? 9 : 9]; @ loader_check.bpf.c:" in str(e.value)
    assert "invalid access to map value" in str(e.value)


def test_the_count_key_layout_comes_from_the_header():
    layout = bpf_object(object_path("counts")).layout("count_key")
    assert layout.fields == ("pid_tgid", "probe", "user_stack", "kernel_stack",
                             "return_address")
    assert layout.struct.format == "<QqqqQ"
