"""A return probe never goes on a function that keeps its own return
address to return to it a second time: setjmp and getcontext store it,
and longjmp or setcontext return to it later, when a return probe has put
its trampoline there (the program died of SIGILL). Found by what the code
does (it reads [sp] before its stack pointer moves), in libc here."""
from __future__ import annotations

import subprocess

import pytest

from helpers import build, fail_one_line, ok, run_ustack

pytestmark = pytest.mark.kernel

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
ROUNDS = 25
KEEPS = "it reads its own return address to return to it a second time"


@pytest.fixture(scope="module")
def jumps():
    prog = build("jumps", flags=("-O2",))
    want = subprocess.run([prog, str(ROUNDS)], capture_output=True, text=True,
                          check=True).stdout
    return prog, want


@pytest.mark.parametrize("function", ["_setjmp", "__sigsetjmp", "getcontext"])
def test_a_uretprobe_there_is_refused_in_one_line(jumps, function):
    prog, _want = jumps
    line = fail_one_line(run_ustack("count", f"uretprobe:libc:{function}",
                                    "-c", f"{prog} {ROUNDS}"))
    assert line == (f"ustack: no uretprobe at {function} in {LIBC}: {KEEPS} "
                    "(as setjmp and getcontext do), and a return probe replaces it")


@pytest.mark.parametrize("backend", ["bpf", "perf", "tracefs"])
def test_globs_leave_them_out_and_the_program_prints_what_it_prints(jumps, backend):
    """`*context` and `*jmp`: the ones that keep their return address
    (getcontext, swapcontext, setjmp, _setjmp) are left out, and said; the
    rest probed (setcontext, makecontext, longjmp, ...); the program's line
    is its unprobed one."""
    prog, want = jumps
    res = ok(run_ustack("count", "uretprobe:libc:*context", "uretprobe:libc:*jmp",
                        "--backend", backend, "-c", f"{prog} {ROUNDS}",
                        *(["-a"] if backend == "tracefs" else [])))
    assert res.stdout.startswith(want) or want in res.stdout.splitlines(True), res.stdout
    assert "was killed by" not in res.stderr, res.stderr
    assert KEEPS in res.stderr, res.stderr


def test_latency_leaves_them_out_too(jumps):
    prog, want = jumps
    res = ok(run_ustack("latency", "uprobe:libc:*jmp", "uprobe:libc:*context",
                        "-c", f"{prog} {ROUNDS}"))
    assert want in res.stdout.splitlines(True), res.stdout
    assert "was killed by" not in res.stderr, res.stderr
