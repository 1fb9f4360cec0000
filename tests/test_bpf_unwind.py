"""DWARF unwinding inside BPF (`--backend bpf --unwind dwarf`): stacks of
programs built -O2 -fomit-frame-pointer, counted in the kernel, must be the
very stacks ustack's copy-and-unwind path finds (`--backend perf --unwind
dwarf`), frame by frame with offsets, and those of `perf record
--call-graph dwarf`; a stack the kernel cannot finish says why."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import O2_NOFP, build, run_ustack
from test_e2e_core import ok, parse_counts, private_copy
from test_e2e_dwarf import perf_script_samples

pytestmark = pytest.mark.kernel

CHAIN = ["d", "c", "b", "a", "main"]
IN_KERNEL = "[backend bpf, unwind dwarf; unwound in the kernel]"
COPIED = "[backend perf, unwind dwarf]"
_OFFSET = re.compile(r"^(?P<func>.+?)\+0x(?P<off>[0-9a-f]+)/0x[0-9a-f]+$")


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=O2_NOFP)


def counted(backend: str, *args) -> list[dict]:
    """`ustack count --offsets` with DWARF unwinding on `backend` (bpf:
    in the kernel; perf: the copy path): its stacks, with notes apart."""
    res = ok(run_ustack("count", "--offsets", "--unwind", "dwarf",
                        "--backend", backend, *args))
    header = res.stderr.splitlines()[0]
    assert (IN_KERNEL if backend == "bpf" else COPIED) in header, header
    assert "Lost" not in res.stderr, res.stderr
    stacks = parse_counts(res.stdout)
    for s in stacks:
        s["notes"] = [f[1:-1] for f, m in s["frames"] if m is None and f.startswith("(")]
        s["frames"] = [(f, m) for f, m in s["frames"] if not (m is None and f.startswith("("))]
    return stacks


def names(frames) -> list[str]:
    return [_OFFSET.match(f)["func"] if _OFFSET.match(f) else f for f, _m in frames]


def same_as_copy_path(*args) -> list[dict]:
    """The in-kernel stacks, asserted equal to the copy path's (the same
    frames, offsets, notes and counts, whatever the order)."""
    kernel = counted("bpf", *args)
    copied = counted("perf", *args)
    key = lambda s: (s["frames"], s["count"])
    assert sorted(map(key, kernel)) == sorted(map(key, copied)), (kernel, copied)
    assert all(s["notes"] == [] for s in kernel + copied), kernel + copied
    return kernel


def test_uprobe_in_o2_no_frame_pointer_chain(chain):
    (stack,) = same_as_copy_path(f"uprobe:{chain}:d", "-c", f"{chain} 7")
    assert stack["count"] == 7
    own = [n for n, (_f, m) in zip(names(stack["frames"]), stack["frames"]) if m == chain.name]
    assert own == CHAIN + ["_start"], stack


def test_syscall_write_through_libc(chain):
    (stack,) = same_as_copy_path("syscall:write", "-c", f"{chain} 5 write")
    assert stack["count"] == 5
    assert names(stack["frames"])[:6] == ["write"] + CHAIN, stack
    assert stack["frames"][0][1] == "libc.so.6"


def _perf_record(perf: str, event: str, argv: list, tmp_path: Path) -> list:
    data = tmp_path / "perf.data"
    rec = subprocess.run([perf, "record", "-q", "-e", event, "--call-graph", "dwarf",
                          "-o", str(data), "--", *argv],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    script = subprocess.run([perf, "script", "-i", str(data)], capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0, script.stderr
    return perf_script_samples(script.stdout)


def _as_perf_shows(frames) -> list[tuple[str, str]]:
    """Our frames as perf script prints them: a caller's pc is the return
    address - 1 (the call instruction), ustack's the return address."""
    out = []
    for i, (f, module) in enumerate(frames):
        m = _OFFSET.match(f)
        out.append((f"{m['func']}+{int(m['off'], 16) - (i > 0):#x}", module))
    return out


def test_same_stacks_as_perf_record_dwarf(chain, tmp_path):
    """syscall:write from d through libc's write: perf's DWARF unwinding of
    its stack copies gives the same frames as the kernel's walk."""
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed (linux-perf): no perf comparison")
    prog = private_copy(chain, tmp_path)
    theirs = [s for s in _perf_record(perf, "syscalls:sys_enter_write",
                                      [str(prog), "3", "write"], tmp_path)
              if any(dso == str(prog) for _sym, dso in s)]
    assert len(theirs) == 3
    (stack,) = counted("bpf", "syscall:write", "-c", f"{prog} 3 write")
    assert stack["count"] == 3 and stack["notes"] == []
    ours = _as_perf_shows(stack["frames"])
    for sample in theirs:
        # perf names objects by path, ustack by file name; perf stops at
        # main's caller chain as far as its copy reaches
        perfs = [(sym, os.path.basename(dso)) for sym, dso in sample]
        assert len(perfs) >= len(CHAIN) + 1
        assert len(perfs) <= len(ours)
        for theirs_frame, our_frame in zip(perfs, ours):
            assert _same_frame(theirs_frame, our_frame, prog), (perfs, ours)


def _same_frame(perfs: tuple, ours: tuple, prog: Path) -> bool:
    """One frame as both tools name it. Outside the program only the
    offset in the function is compared: libc's functions have aliases
    (write, __GI___libc_write), and perf labels some of its frames
    "(inlined)" (its srcline guess) where ustack names the module."""
    (sym, module), (our_sym, our_module) = perfs, ours
    if module == prog.name:
        return perfs == ours
    return sym.rpartition("+")[2] == our_sym.rpartition("+")[2] and \
        module in (our_module, "inlined")
