"""The in-kernel unwinder's row table is sized by what the targets map,
`--unwind-memory` sets it, and a stack through an object whose rows did
not fit is still whole: the header names the object and the option, and
the stack is unwound from its copy in user space."""
from __future__ import annotations

import glob
import re
import subprocess
import sys

import pytest

from helpers import O2_NOFP, build, parse_folded, run_attached, run_ustack, stop
from ustack.capture.bpf_unwind import (DEFAULT_ROWS, MAX_UNWIND_MEMORY, ROW_SIZE, rows_capacity,
                                      rows_estimate)
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables

CHAIN = ["_start", "__libc_start_main", "__libc_start_call_main", "main", "work", "spin_here"]
LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


@pytest.mark.kernel
def test_an_object_that_does_not_fit_is_named_and_its_stacks_stay_whole():
    busy = build("busy", flags=O2_NOFP)          # no frame pointers: only CFI unwinds it
    target = subprocess.Popen([str(busy), "1", "-"], stdin=subprocess.PIPE)
    try:
        # 0.1 MiB: 6,553 rows, room for the program, ld.so and the vDSO, not libc's 28 k
        res = run_attached(target, "profile", "-F", "199", "--backend", "bpf", "-f", "folded",
                           "--unwind-memory", "0.1", timeout=120)
    finally:
        stop(target)
    assert res.returncode == 0, res.stderr
    header = res.stderr.splitlines()[0]
    assert re.search(r"1 object's unwind rows did not fit the in-kernel table "
                     r"\(0\.1 MiB: libc\.so\.6\).*--unwind-memory MIB makes it bigger",
                     header), header
    mine = [(stack, n) for stack, n in parse_folded(res.stdout) if stack[0] == "busy"]
    total = sum(n for _s, n in mine)
    rooted = sum(n for stack, n in mine if stack[1:4] == CHAIN[:3])
    spinning = sum(n for stack, n in mine if stack[1:7] == CHAIN)
    # 1 s of the program's own CPU time at 199 Hz
    assert total >= 100, res.stdout
    # every stack whole to _start through libc; all in spin_here but a
    # sample or two as the program exits (exit, __run_exit_handlers)
    assert rooted == total, mine
    assert spinning >= total - 2, mine
    assert "stack cut" not in res.stdout + res.stderr, res.stderr


def test_the_table_is_sized_by_what_the_objects_need():
    """Each object's estimate covers its real rows, so objects that fit
    together get a table they fit in; the least size is kept for small
    targets, and --unwind-memory is taken as given."""
    objects = [LIBC, "/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/python3.11"]
    for path in objects:
        real = len(tables.for_image(ElfImage.open(path)))
        assert real <= rows_estimate(path) <= 2 * real, (path, real)
    assert rows_capacity([LIBC]) == DEFAULT_ROWS
    big = [LIBC] * 40                     # ~40 libc's worth: more than the least size
    assert rows_capacity(big) >= 40 * len(tables.for_image(ElfImage.open(LIBC)))
    assert rows_capacity(big, 1 << 20) * ROW_SIZE == 1 << 20


@pytest.mark.parametrize("value", ["0", "-1", "1e9"])
def test_a_bad_size_is_one_line(value):
    res = run_ustack("profile", "--backend", "bpf", "-d", "1", "--unwind-memory", value)
    assert res.returncode != 0
    assert res.stderr.strip() == "ustack: --unwind-memory must be between 0 and 65536 MiB", \
        res.stderr


@pytest.mark.kernel
def test_an_object_mapped_later_that_does_not_fit_is_named_at_the_end():
    """A library dlopen'd during the run (libstdc++, 34 k rows) finds the
    table full: the summary names it first, though the header named three
    objects of the start (libc, ld.so and libm, linked in for that)."""
    from helpers import spawn
    prog = build("dlopen_deep", flags=(*O2_NOFP, "-Wl,--no-as-needed", "-lm"))
    stdcxx = "/lib/x86_64-linux-gnu/libstdc++.so.6"
    target = spawn(prog, stdcxx, 3, 3, "-", stdin=subprocess.PIPE)   # no plugin_back in it
    try:
        res = run_attached(target, "count", "--backend", "bpf", "--unwind-memory", "0.02",
                           "syscall:exit_group", timeout=60)
    finally:
        stop(target)
    assert res.returncode == 0, res.stderr
    header, *rest = res.stderr.splitlines()
    assert "libc.so.6" in header and "libstdc++" not in header, header
    ends = [line for line in rest if "unwind rows did not fit" in line]
    assert len(ends) == 1, res.stderr
    # the summary counts the start's objects and those mapped later (libstdc++
    # and, as their rows come, libm and libgcc_s it needs), naming the later first
    named_first = int(header.split(" objects' unwind rows did not fit")[0].rsplit(" ", 1)[1])
    at_end = int(ends[0].split(" objects' unwind rows did not fit")[0])
    assert at_end > named_first, res.stderr
    assert "libstdc++.so.6" in ends[0], res.stderr
    assert "--unwind-memory MIB makes it bigger" in ends[0]


@pytest.mark.kernel
def test_a_whole_machine_table_holds_what_the_machine_maps():
    """A whole-machine run sizes its table by the objects every process
    maps (within MAX_UNWIND_MEMORY), not the 16 MiB least size: a process
    holding libLLVM (~1 M rows alone) gets room for it at the start."""
    llvm = next(iter(sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libLLVM-*.so*"))), None)
    if llvm is None:
        pytest.skip("no libLLVM here (Debian's clang brings it)")
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import ctypes, sys; ctypes.CDLL({llvm!r}); "
         "print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "ready\n"
        res = run_ustack("profile", "-F", "49", "-d", "0.5", "--backend", "bpf",
                         "-o", "/dev/null", timeout=300)
    finally:
        holder.stdin.close()
        stop(holder)
    assert res.returncode == 0, res.stderr
    room = re.search(r"tables loaded as objects are sampled \(room for (\d+) MiB of rows: "
                     r"what the machine maps; \d+ MiB made, more as needed\)", res.stderr)
    assert room, res.stderr
    need = (rows_estimate(llvm) + DEFAULT_ROWS // 2) * ROW_SIZE >> 20
    assert int(room[1]) >= min(need, MAX_UNWIND_MEMORY >> 20), (room[0], need)
