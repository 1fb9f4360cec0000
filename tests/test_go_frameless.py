"""Go's frameless leaves keep their caller on every backend and command
that shows a stack. A frameless Go function (main.leaf: no calls, nothing
on the stack) leaves rbp holding its caller's frame, so a frame-pointer
walk from inside it goes straight to its caller's caller: auto unwinds Go
with its pclntab (the SP delta at each pc), in the kernel or on the copy
path, and frame pointers only when asked (where the loss is shown too)."""
from __future__ import annotations

import pytest

from helpers import build_go, funcs, ok, parse_folded, parse_trace, run_ustack

pytestmark = pytest.mark.kernel

RUN_MS = 600
HZ = 499


@pytest.fixture(scope="module")
def goleaf():
    return build_go("goleaf")


def _callers_of_leaf(stacks) -> list:
    """The frame above main.leaf in each sample whose leaf frame it is
    (stacks innermost first, as (frames, count))."""
    out = []
    for frames, n in stacks:
        if frames and frames[0] == "main.leaf":
            out += [frames[1] if len(frames) > 1 else None] * n
    return out


def _counted(goleaf, *args) -> list:
    res = ok(run_ustack(*args, "-c", f"{goleaf} {RUN_MS}", "-f", "folded"))
    return [(stack[:0:-1], n) for stack, n in parse_folded(res.stdout)]


def _traced(goleaf, *args) -> list:
    res = ok(run_ustack("trace", f"profile:hz:{HZ}", *args, "-c", f"{goleaf} {RUN_MS}"))
    return [(funcs(r["frames"]), 1) for r in parse_trace(res.stdout)]


RUNS = {
    "profile": lambda g: _counted(g, "profile", "-F", str(HZ)),
    "profile --backend perf": lambda g: _counted(g, "profile", "-F", str(HZ),
                                                 "--backend", "perf"),
    "count --backend perf": lambda g: _counted(g, "count", f"profile:hz:{HZ}",
                                               "--backend", "perf"),
    "trace": lambda g: _traced(g),
    "trace --backend perf": lambda g: _traced(g, "--backend", "perf"),
}


@pytest.mark.parametrize("run", list(RUNS))
def test_every_sample_of_a_frameless_leaf_keeps_its_caller(goleaf, run):
    callers = _callers_of_leaf(RUNS[run](goleaf))
    assert len(callers) >= 20, f"only {len(callers)} samples in main.leaf"
    assert set(callers) == {"main.work"}, \
        f"{callers.count('main.work')} of {len(callers)} samples kept main.work"


def test_frame_pointers_when_asked_skip_the_caller(goleaf):
    """What the default avoids: --unwind fp goes from main.leaf to main.main."""
    callers = _callers_of_leaf(_counted(goleaf, "profile", "-F", str(HZ),
                                        "--backend", "perf", "--unwind", "fp"))
    assert len(callers) >= 20 and callers.count("main.main") >= len(callers) * 0.9, callers


@pytest.mark.parametrize("backend", ["auto", "perf"])
def test_go_syscall_stack_keeps_its_assembly_leaves(backend, tmp_path):
    """A Go write(2) leaves through two frameless assembly functions:
    Syscall6 and the RawSyscall6 that calls it (frame pointers lost the
    latter). The program's own writes go to the terminal, the trace to a file."""
    gochain = build_go("gochain")
    out = tmp_path / "trace.txt"
    ok(run_ustack("trace", "syscall:write", "--backend", backend, "-o", out,
                  "-c", f"{gochain} 1 write"))
    (rec,) = [r for r in parse_trace(out.read_text())
              if r["frames"] and r["frames"][0]["func"].endswith("Syscall6")]
    assert funcs(rec["frames"])[:9] == [
        "runtime/internal/syscall.Syscall6", "syscall.RawSyscall6", "syscall.Syscall",
        "syscall.write", "main.d", "main.(*T).c", "main.b", "main.a", "main.main"]
