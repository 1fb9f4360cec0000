"""The library closure a launched command will map (objfile/needed.py),
which the in-kernel unwinder loads before the command's first
instruction: DT_NEEDED through RUNPATH with $ORIGIN, as ld.so finds it."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ustack.objfile.needed import load_closure


def _gcc(*args) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    subprocess.run(["gcc", *map(str, args)], check=True, capture_output=True)


def test_origin_is_where_each_path_lies(tmp_path):
    """One file (hard links) in two directories, each with its own lib/:
    $ORIGIN is the directory of the path asked about, also when the
    file's facts come back from the cache the second time."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "foo.c").write_text("int foo(void) { return 1; }\n")
    (src / "main.c").write_text("int foo(void);\nint main(void) { return foo() - 1; }\n")
    first, second = tmp_path / "a", tmp_path / "b"
    for d in (first, second):
        (d / "lib").mkdir(parents=True)
        _gcc("-shared", "-fPIC", "-o", d / "lib" / "libfoo.so", src / "foo.c")
    _gcc("-o", first / "prog", src / "main.c", "-L", first / "lib", "-lfoo",
         "-Wl,-rpath,$ORIGIN/lib")
    os.link(first / "prog", second / "prog")
    for d in (first, second, first):
        closure = load_closure(str(d / "prog"))
        assert closure[0] == str(d / "prog")
        assert str(d / "lib" / "libfoo.so") in closure, closure
        assert any(p.endswith("/libc.so.6") for p in closure), closure
        assert subprocess.run([d / "prog"]).returncode == 0    # ld.so agrees
