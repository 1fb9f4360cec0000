"""funccount through uprobe_multi links (capture/bpf_funccount.py): the
counts of the processes asked for, exact, and a glob over many functions
ends without the per-uprobe teardown wait (nothing asserts time: the
counts and the leftovers are what a user checks).

tests/programs/branches.c calls leaf N times through left and M times
through right; with "-" it waits for a line on stdin, so the test lets it
go only once ustack traces."""
from __future__ import annotations

import subprocess

import pytest

from helpers import (build, finish, ok, private_copy, release, run_attached_beside,
                     run_ustack, start_ustack, stop, wait_tracing)

from ustack.capture.bpf_funccount import uprobe_multi_supported

pytestmark = pytest.mark.kernel
links = pytest.mark.skipif(not uprobe_multi_supported(),
                           reason="this kernel makes no uprobe_multi links (before 6.6)")


def table(text: str) -> dict:
    lines = text.splitlines()
    assert lines[0].split() == ["FUNC", "COUNT"], text
    return {name: int(n) for name, n in (line.split() for line in lines[1:])}


def waiting(prog, n: int, m: int) -> subprocess.Popen:
    return subprocess.Popen([str(prog), str(n), str(m), "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)


@links
def test_only_the_process_asked_for_is_counted(tmp_path):
    """-p PID: that process's calls, none of another running the same
    binary at the same time."""
    prog = private_copy(build("branches"), tmp_path)
    res = run_attached_beside(waiting(prog, 3, 1), waiting(prog, 7, 7),
                              "funccount", f"{prog}:[lr]*")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert table(out) == {"leaf": 4, "left": 1, "right": 1}, out


@links
def test_a_list_of_processes_is_counted(tmp_path):
    """-p A,B: both listed processes' calls, none of a third running the
    same binary; the run ends when A and B have exited."""
    prog = private_copy(build("branches"), tmp_path)
    a, b, other = waiting(prog, 3, 1), waiting(prog, 5, 2), waiting(prog, 7, 7)
    try:
        us = start_ustack("funccount", f"{prog}:[lr]*", "-p", f"{a.pid},{b.pid}",
                          stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us)
            for proc in (a, b, other):
                release(proc)
            for proc in (a, b, other):
                assert proc.wait(timeout=30) == 0
            out, err = finish(us)
        finally:
            stop(us)
    finally:
        for proc in (a, b, other):
            stop(proc)
    assert us.returncode == 0, header + err
    assert table(out) == {"leaf": 3 + 1 + 5 + 2, "left": 2, "right": 2}, out


@links
def test_a_command_is_counted_from_its_exec(tmp_path):
    """-c: the calls of the command itself, counted exactly from its exec
    (register_tm_clones: the C start-up code's, once, before main)."""
    prog = private_copy(build("branches"), tmp_path)
    res = ok(run_ustack("funccount", f"{prog}:[lr]*", "-c", f"{prog} 30 12"))
    assert table(res.stdout) == {"leaf": 42, "left": 1, "right": 1,
                                 "register_tm_clones": 1}, res.stdout


@links
def test_many_functions_at_once(tmp_path):
    """A glob of libc's *write* functions (33 uprobes on one link): the
    program's 25 write() calls counted exactly, nothing else it did not
    call, and no uprobe left behind (the suite's leftover check)."""
    prog = private_copy(build("chain"), tmp_path)
    res = ok(run_ustack("funccount", "libc:*write*", "-c", f"{prog} 25 write"))
    assert "… (" in res.stderr.splitlines()[0], res.stderr      # many events
    assert table(res.stdout) == {"write": 25}, res.stdout


@pytest.mark.parametrize("release, links", [
    ("6.18.44-fc-v669", True), ("6.6.0", True), ("6.5.13-generic", False),
    ("5.15.0-91-generic", False), ("weird", False)])
def test_links_only_where_the_kernel_makes_them(release, links):
    """Before Linux 6.6 funccount keeps a perf event per uprobe."""
    assert uprobe_multi_supported(release) is links
