"""A program exec'd after a run unwinding in the kernel started
(`--backend bpf --unwind dwarf`): the kernel has no unwind rows for it until
ustack reads its MMAP2 record, so the walk hands those events' registers and
stack to ustack (capture/bpf_unwind.py, deferred records), which unwinds
them itself: a short program's stacks are complete, none cut with "no
unwind table loaded yet". Each program is a fresh copy (a new inode no
run has loaded), started once ustack traces. Programs exec'd in turns
also reuse each other's freed mm_struct: the walk's cache of VMAs must
tell them apart."""
from __future__ import annotations

import signal
import subprocess

import pytest

import ustack
from helpers import (O2_FP, O2_NOFP, build, finish, ok, parse_counts, parse_trace,
                     private_copy, run_ustack, start_ustack, stop, wait_tracing)
from ustack.capture import bpf_unwind

pytestmark = pytest.mark.kernel

# (a whole-machine run adds ", tables loaded as objects are sampled")
IN_KERNEL = "[backend bpf, unwind dwarf; unwound in the kernel"
CUT = "cut short"


def whole_write_stack(prog: str) -> list:
    """(function, module) of chain's write(2), innermost first, to _start."""
    return ([("write", "libc.so.6")] + [(f, prog) for f in ("d", "c", "b", "a", "main")]
            + [("__libc_start_call_main", "libc.so.6"), ("__libc_start_main", "libc.so.6"),
               ("_start", prog)])


@pytest.fixture
def fresh_chain(tmp_path):
    return private_copy(build("chain", flags=O2_NOFP), tmp_path)


def system_wide(*args, program: list) -> tuple:
    """Run ustack over the whole machine, start `program` once it traces,
    end the run (SIGINT) once the program exited: (stdout, stderr, pid)."""
    us = start_ustack(*args, "--backend", "bpf", "--unwind", "dwarf",
                      stdout=subprocess.PIPE)
    try:
        header = wait_tracing(us, timeout=60)
        assert IN_KERNEL in header, header
        proc = subprocess.Popen([str(a) for a in program], stdout=subprocess.DEVNULL)
        assert proc.wait(timeout=30) == 0
        us.send_signal(signal.SIGINT)
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    return out, err, proc.pid


def test_count_whole_machine_program_started_during_the_run(fresh_chain):
    out, err, pid = system_wide("count", "-P", "syscall:write",
                                program=[fresh_chain, 3, "write"])
    mine = [s for s in parse_counts(out) if s["pid"] == pid]
    assert [(s["frames"], s["count"]) for s in mine] == \
        [(whole_write_stack(fresh_chain.name), 3)], out


def test_trace_whole_machine_program_started_during_the_run(fresh_chain):
    out, err, pid = system_wide("trace", "syscall:write",
                                program=[fresh_chain, 3, "write"])
    mine = [e for e in parse_trace(out) if e["pid"] == pid]
    assert len(mine) == 3, out
    for e in mine:
        assert [(f["func"], f["module"]) for f in e["frames"]] == \
            whole_write_stack(fresh_chain.name), e
        assert e["notes"] == [], e


def test_command_execs_a_program_its_words_do_not_name(fresh_chain):
    """`sh -c 'P=…; exec $P'`: the program is not among the command's
    words, so its rows are not loaded before the run starts."""
    res = ok(run_ustack("count", "syscall:write", "--backend", "bpf", "--unwind", "dwarf",
                        "-c", f"sh -c 'P={fresh_chain}; exec $P 3 write'"))
    assert IN_KERNEL in res.stderr.splitlines()[0], res.stderr
    stacks = parse_counts(res.stdout)
    assert [(s["frames"], s["count"]) for s in stacks] == \
        [(whole_write_stack(fresh_chain.name), 3)], res.stdout
    assert CUT not in res.stderr, res.stderr


def test_kernel_frames_above_a_deferred_stack(fresh_chain):
    """--kernel: a deferred stack keeps the kernel's frames of its event."""
    res = ok(run_ustack("count", "--kernel", "syscall:write", "--backend", "bpf",
                        "--unwind", "dwarf",
                        "-c", f"sh -c 'P={fresh_chain}; exec $P 3 write'"))
    (stack,) = parse_counts(res.stdout)
    mods = [m for _f, m in stack["frames"]]
    sep = mods.index(None)
    assert stack["frames"][sep][0] == "--" and set(mods[:sep]) == {"kernel"}, stack
    assert stack["frames"][sep + 1:] == whole_write_stack(fresh_chain.name), stack
    assert stack["count"] == 3


def test_profile_whole_machine_program_started_during_the_run(tmp_path):
    """Samples of a program exec'd during a profile, its first ones
    included, are unwound to _start; none is cut short (before, the first
    ones said "no unwind table loaded yet" or "the process's memory map
    was locked"). The process's samples before its exec (Python's, forked
    from pytest) end elsewhere: one taken inside execve, once the new
    memory map is in place but the registers are still the old program's,
    is cut at an address in no mapping, as it always was; one taken before
    that walks pytest's deep C stack to the in-kernel frame limit, or, where
    the interpreter's rows were not loaded yet (a whole-machine run loads
    them as they are sampled), to the end of the stack copy it was deferred
    with."""
    busy = private_copy(build("busy", flags=O2_NOFP), tmp_path)
    out, err, pid = system_wide("profile", "-F", "199", "-P", program=[busy, "0.3"])
    mine = [s for s in parse_counts(out) if s["pid"] == pid]
    assert any(("spin_here", busy.name) in s["frames"] for s in mine), out
    for s in mine:
        notes = [f for f, m in s["frames"] if m is None and f.startswith("(")]
        if any(m == busy.name for _f, m in s["frames"]):
            assert notes == [] and s["frames"][-1] == ("_start", busy.name), s
        else:
            # (the in-kernel walk's note ends at "no mapping"; a deferred
            # one's, unwound in user space, says more after it)
            assert all(": the address is in no mapping" in n
                       or n.endswith((": stopped at the in-kernel frame limit)",
                                      "the stack was cut short; raise --stack-size)"))
                       for n in notes), \
                (notes, s)


def test_a_full_ring_counts_the_stack_cut_as_walked(fresh_chain, monkeypatch):
    """With a ring that holds one deferred stack, most of 20,000 writes
    before the program's rows are loaded find it full: each event is
    counted all the same, complete (unwound by ustack, or in the kernel
    once the rows are in) or cut where the walk stopped, saying why."""
    monkeypatch.setattr(bpf_unwind, "DEFER_RING_BYTES", 16 << 10)
    opts = ustack.Options(command="count", events=["syscall:write"], backend="bpf",
                          unwind="dwarf",
                          cmdline=f"sh -c 'P={fresh_chain}; exec $P 20000 write'")
    with ustack.Session(opts) as run:
        counted = run.counts()
        losses = run.capture.losses()
        assert losses.lost == 0
    whole = [f for f, _m in whole_write_stack(fresh_chain.name)]
    cut = (f"stack cut at {fresh_chain.name}: no unwind table loaded yet for this object",)
    for c in counted:
        frames = [f.function for f in c.stack.frames]
        assert (frames, c.stack.notes) in ((whole, ()), (whole[:2], cut)), c
    assert sum(c.count for c in counted) == 20000
    # every cut one found the ring full, and the run's summary says so
    assert sum(c.count for c in counted if c.stack.notes) == losses.deferral_full


def test_programs_exec_d_one_after_another_on_a_reused_mm(tmp_path):
    """Two non-PIE programs with their code at the same addresses but laid
    out differently, run in turns: each exec's mm_struct is often the one
    the previous program freed, and the unwinder's cache of VMAs must not
    give one program the other's file (its stacks then ended early, at d,
    without a note)."""
    fp = tmp_path / "fpchain"
    nofp = tmp_path / "nofpchain"
    fp.write_bytes(build("chain", flags=O2_FP, pie=False).read_bytes())
    nofp.write_bytes(build("chain", flags=O2_NOFP, pie=False).read_bytes())
    for p in (fp, nofp):
        p.chmod(0o755)
    us = start_ustack("count", "-P", f"uprobe:{fp}:d", f"uprobe:{nofp}:d",
                      "--backend", "bpf", "--unwind", "dwarf", stdout=subprocess.PIPE)
    pids = {}
    try:
        assert IN_KERNEL in wait_tracing(us, timeout=60)
        for prog in (fp, nofp, nofp, fp) * 2:
            proc = subprocess.Popen([str(prog), "1"])
            assert proc.wait(timeout=30) == 0
            pids[proc.pid] = prog.name
        us.send_signal(signal.SIGINT)
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    mine = [s for s in parse_counts(out) if s["pid"] in pids]
    assert len(mine) == len(pids), out
    for s in mine:
        prog = pids[s["pid"]]
        assert s["frames"] == whole_write_stack(prog)[1:] and s["count"] == 1, s


def test_the_summary_says_the_ring_was_full():
    """What a user reads after such a run (no kernel needed)."""
    import io
    from ustack.model import Losses
    from ustack.report.summary import write_summary
    err = io.StringIO()
    write_summary(err, losses=Losses(cut_short=(
        ("no unwind table loaded yet for this object", 7),), deferral_full=5),
        buffer_pages=64)
    assert err.getvalue().splitlines() == [
        "7 events' stacks were cut short by the in-kernel unwinder (7: no unwind "
        "table loaded yet for this object); each such stack ends with a note",
        "5 of them could have been finished by ustack but its ring for them was full "
        "(stacks the kernel could not walk: a program started before its unwind "
        "table was loaded, a memory map locked, a table full, a stack deeper than "
        "the walk): try --buffer-pages 1024"]


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_execve_event_is_named_for_the_caller(backend, fresh_chain):
    """An execve call is made by the old program: its event carries the old
    program's stack and so its name (`sh`, as perf names it), not that of
    the program it starts, whose COMM record the same batch brings."""
    res = ok(run_ustack("trace", "syscall:execve", "--backend", backend, "-c",
                        f"sh -c '{fresh_chain} 1 >/dev/null; {fresh_chain} 1 >/dev/null'"))
    records = parse_trace(res.stdout)
    assert len(records) == 2, res.stdout
    for rec in records:
        assert rec["comm"] == "sh", res.stdout
        assert [f["module"] for f in rec["frames"][:2]] == ["libc.so.6", "dash"], res.stdout
    res = ok(run_ustack("count", "-f", "folded", "-P", "syscall:execve", "--backend", backend,
                        "-c", f"sh -c '{fresh_chain} 1 >/dev/null; {fresh_chain} 1 >/dev/null'"))
    heads = [line.split(";")[0] for line in res.stdout.splitlines() if "execve" in line]
    assert len(heads) == 2 and all(h.startswith("sh-") for h in heads), res.stdout
