"""A -c command whose child runs the parent's program, then execs: the
child's stacks from before the exec are named with the maps it had then
(its parent's), those after with the new program's, on every backend.
forkexec's child calls in_child -> hit 3 times, then execs itself as
`forkexec leaf 3`, which calls after_exec -> leaf 3 times: PIE, so the
two programs sit at different addresses."""
from __future__ import annotations

import subprocess

import pytest

from helpers import build, ok, parse_counts, popen_ustack, run_ustack, stop

pytestmark = pytest.mark.kernel

N = 3
PRE = [("hit", "forkexec"), ("in_child", "forkexec"), ("main", "forkexec")]
POST = [("leaf", "forkexec"), ("after_exec", "forkexec"), ("main", "forkexec")]


@pytest.mark.parametrize("backend, unwind", [
    ("bpf", "dwarf"), ("bpf", "fp"), ("perf", "dwarf")])
def test_child_stacks_before_and_after_its_exec(backend, unwind):
    prog = build("forkexec")
    res = ok(run_ustack("count", "--backend", backend, "--unwind", unwind,
                        f"uprobe:{prog}:hit", f"uprobe:{prog}:leaf", "-c", f"{prog} {N}"))
    got = sorted((s["frames"][:3], s["count"]) for s in parse_counts(res.stdout))
    assert got == sorted([(PRE, N), (POST, N)]), res.stdout


@pytest.mark.parametrize("unwind", ["dwarf", "fp"])
def test_tracefs_child_stacks_before_and_after_its_exec(unwind):
    """ftrace has no fork, exec or mmap records: the instance's
    sched_process_fork/exec events and /proc stand in. The exec'd child
    outlives the traced command (it waits for a line on stdin), so its maps
    can be read when its events are; its stacks from before the exec were
    read after it, and are named from its parent's maps."""
    prog = build("forkexec")
    us = popen_ustack("count", "--backend", "tracefs", "--unwind", unwind,
                      f"uprobe:{prog}:hit", f"uprobe:{prog}:leaf", "-c", f"{prog} {N} -",
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    try:
        us.wait(timeout=30)          # the child, holding stdin, outlives the run
        us.stdin.close()             # now it ends (its stdout is ustack's too)
        out, err = us.stdout.read(), us.stderr.read()
    finally:
        stop(us)
    assert us.returncode == 0, err
    got = sorted((s["frames"][:3], s["count"]) for s in parse_counts(out))
    assert got == sorted([(PRE, N), (POST, N)]), out
