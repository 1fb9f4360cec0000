"""Python frames on the copy path (`--backend perf`): each sample's stack is
copied by the kernel and its thread's Python frames are read from the
process's memory as the sample comes off the ring (unwind/python_live.py),
then merged by the unwinder only where the read agrees with the sample
(unwind/python_frames.merge_read); a sample it disagrees with keeps its C
frames and says so. Programs: tests/programs/python/frames.py under every
CPython 3.8-3.13 of pyenv and Debian's static python3.11, attached with -p
(the process lives while ustack reads what it buffered). Oracle: the bpf
backend's in-kernel walk on the same process, and the program's own
structure (test_python_frames.py's chains)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from helpers import (DEBIAN_PYTHON, EVAL, MIN_SAMPLES, TAILS, chains,
                     natives_between_leaf_and_key, pyenv_python, python_only,
                     run_for_cpu, start_waiting, stop)
from helpers import PY_CHAIN as CHAIN
from ustack.model import python_frame_word
from ustack.unwind.python_frames import merge_read

pytestmark = pytest.mark.kernel

# each way an eval call holds Python frames, 3.12 and 3.13 laid out apart
VERSIONS = ("3.8", "3.11", "3.12", "3.13", DEBIAN_PYTHON)
MARK = "Python frames not shown"            # a sample the read disagreed with
HEADER = "Python frames read from the process after each sample"
# the share of judged samples that must show the whole chain (the rest
# marked): enough that marking every sample fails
WHOLE_AT_LEAST = 0.75


def interpreter(version: str) -> str:
    if version.startswith("/"):
        if not Path(version).exists():
            pytest.skip(f"{version} is not installed")
        return version
    return pyenv_python(version)


def runs_on(python: str, mode: str, *runs) -> tuple:
    """([(stacks or events, stderr) per run], facts): each run, `ustack
    ARGS -f json -p PID` for 1 s of the program's CPU time, on one frames.py
    MODE process, one after the other."""
    proc, facts = start_waiting(python, mode)
    out = []
    try:
        for args in runs:
            run = run_for_cpu(facts["pid"], *args, "-f", "json")
            text, err = run.stdout, run.stderr
            assert run.returncode == 0, err
            if args[0] == "trace":
                out.append(([dict(e, count=1) for e in map(json.loads, text.splitlines())], err))
            else:
                out.append((json.loads(text)["stacks"], err))
    finally:
        proc.stdin.close()
        stop(proc)
    return out, facts


def profile(*args) -> tuple:
    return ("profile", "-F", "199", *args)


def judge(stacks: list, facts: dict, full) -> tuple:
    """(samples whose frames pass `full`, marked samples, samples judged:
    those of the program's main() and the marked ones). A marked sample
    keeps the eval loop's C frames and shows no Python frame."""
    whole = marked = total = 0
    for s in stacks:
        (frames, n), = chains([s], facts)
        if any(note.startswith(MARK) for note in s.get("notes", ())):
            assert not python_only(frames), s
            assert any(native == EVAL for _py, native in frames), s
            marked += n
            total += n
        elif "main" in python_only(frames):
            total += n
            whole += n if full(frames) else 0
    return whole, marked, total


def assert_whole(stacks: list, facts: dict, full, at_least: float = WHOLE_AT_LEAST) -> None:
    whole, marked, total = judge(stacks, facts, full)
    common = Counter()
    for frames, n in chains(stacks, facts):
        common[";".join(map(str, python_only(frames)))] += n
    assert total >= MIN_SAMPLES, (total, common.most_common(3))
    assert whole + marked >= 0.95 * total and whole >= at_least * total, (
        f"{whole} whole and {marked} marked of {total}; most common: {common.most_common(4)}")


def ends_with(tail: list):
    def full(frames):
        return python_only(frames) == CHAIN + tail
    return full


def most_common_chain(stacks: list, facts: dict) -> tuple:
    found = Counter()
    for frames, n in chains(stacks, facts):
        found[tuple(python_only(frames))] += n
    return found.most_common(1)[0][0]


# --- a busy program: the whole chain, as the in-kernel walk gives it -------------

@pytest.mark.parametrize("version", VERSIONS)
def test_copy_path_shows_the_chain_bpf_shows(version):
    ((perf, err), (bpf, _err)), facts = runs_on(interpreter(version), "busy",
                                                profile("--backend", "perf"),
                                                profile("--backend", "bpf"))
    assert HEADER in err
    assert_whole(perf, facts, ends_with(TAILS["busy"]))
    assert most_common_chain(perf, facts) == most_common_chain(bpf, facts) == tuple(
        CHAIN + TAILS["busy"])


# --- C between Python frames: sorted() calling its key back ----------------------

@pytest.mark.parametrize("version", ["3.8", "3.11", "3.13"])
def test_copy_path_keeps_c_frames_between(version):
    """builtin sorted() stays between leaf and the key function it calls;
    no eval loop C frame is left above a Python frame. (3.8-3.10 run each
    Python call in a C call of its own: this chain's copy needs more than
    the default 8 KiB, else its stacks are marked incomplete. The key
    function's calls are short: a read some ms after the sample finds the
    thread in another call more often than in the busy program, and marks
    the sample, on a loaded machine up to half of them. The versions: the
    three ways an eval call holds Python frames.)"""
    ((perf, _err),), facts = runs_on(interpreter(version), "sorted",
                                     profile("--backend", "perf", "--stack-size", "16384"))
    full = ends_with(TAILS["sorted"])
    assert_whole(perf, facts, lambda frames: full(frames) or python_only(frames) == CHAIN + [
        "key_of"], at_least=0.4)
    between = natives_between_leaf_and_key(chains(perf, facts))
    (natives, _n), = between.most_common(1)
    assert natives and EVAL not in natives, between.most_common(3)
    if not version.startswith("/"):        # Debian's stripped python names no static function
        assert "builtin_sorted" in natives, between.most_common(3)


# --- threads: each sample's own thread's frames ------------------------------------

@pytest.mark.parametrize("version", ["3.8", "3.12", DEBIAN_PYTHON])
def test_copy_path_reads_the_sampled_threads_frames(version):
    """Three threads, each in its own function: a sample's Python frames
    are its own thread's (its PyThreadState found by the thread's id)."""
    ((perf, _err),), facts = runs_on(interpreter(version), "threads",
                                     ("trace", "--backend", "perf", "profile:hz:199"))
    seen = Counter()
    for s in perf:
        (frames, n), = chains([s], facts)
        seq = python_only(frames)
        if "threaded" in seq:
            work = seq[seq.index("threaded") + 1:seq.index("threaded") + 2]
            seen[(s["tid"], tuple(work))] += n
    by_work: dict = {}
    for (tid, work), n in seen.items():
        if n > 5:
            by_work.setdefault(work, set()).add(tid)
    # each function in one thread of its own, and each thread in one function
    assert sorted(by_work) == [("work_a",), ("work_b",), ("work_c",)], seen
    assert all(len(tids) == 1 for tids in by_work.values()), seen
    assert len(set().union(*by_work.values())) == 3, seen


# --- trace: a uprobe in C code Python called --------------------------------------

@pytest.mark.parametrize("version", ["3.12", DEBIAN_PYTHON])
def test_copy_path_trace_of_a_uprobe_under_python(version):
    """libc's write under print: each event shows the Python chain above
    the C frames, or is marked (the thread had moved on by the read)."""
    ((events, err),), facts = runs_on(interpreter(version), "write",
                                      ("trace", "--backend", "perf", "uprobe:libc:write"))
    assert HEADER in err
    mine = [e for e in events if e["pid"] == facts["pid"]]
    assert all(e["frames"][0]["function"] == "write" for e in mine)
    assert_whole(mine, facts, lambda frames: python_only(frames) == CHAIN)


def test_no_python_on_the_copy_path():
    """--no-python: the eval loop's C frames, no Python frame, no note, and
    the header does not speak of them."""
    ((perf, err),), facts = runs_on(pyenv_python("3.11"), "busy",
                                    profile("--backend", "perf", "--no-python"))
    assert HEADER not in err
    frames = [f for frames, _n in chains(perf, facts) for f in frames]
    assert not any(py is not None for py, _native in frames)
    assert sum(1 for _py, native in frames if native == EVAL) > 10
    assert not any(note.startswith(MARK) for s in perf for note in s.get("notes", ()))


# --- the agreement rule, on made-up stacks (no kernel) ----------------------------

EVAL_RANGE = ((0x1000, 0x2000),)
CODE_A, CODE_B, FRAME = 0x7F0000001000, 0x7F0000002000, 0x7F00DEAD0000


def merged(pcs, groups, regs=None, stack=b"", sps=None, whole=True, note="", copy_cut=False):
    return merge_read(pcs, (groups, note, EVAL_RANGE, FRAME), whole,
                      regs or {"ip": pcs[0], "bx": FRAME}, stack, sps or list(range(len(pcs))),
                      copy_cut=copy_cut)


def test_merge_read_rules():
    pcs = (0x5000, 0x1010, 0x6000)                 # C, eval (returned into), C
    groups = (((CODE_A, 3), (CODE_B, 7)),)
    words = (0x5000, python_frame_word(CODE_A, 3), python_frame_word(CODE_B, 7), 0x6000)
    assert merged(pcs, groups) == (words, ())
    # the thread's frame then held in no register nor on the copy below the eval frame
    sps = [0x100, 0x180, 0x200]
    out, notes = merged(pcs, groups, regs={"ip": 0x5000}, stack=bytes(0x100)
                        + FRAME.to_bytes(8, "little"), sps=sps)
    assert out == pcs and notes == ("Python frames not shown: read after the sample, "
                                    "the thread was in another Python frame",)
    # ... on the copy, at or below it: the same moment
    stack = bytes(0x40) + FRAME.to_bytes(8, "little") + bytes(0x38)
    assert merged(pcs, groups, regs={"ip": 0x5000}, stack=stack, sps=sps) == (words, ())
    # another number of eval calls than the stack has
    out, notes = merged(pcs, groups + (((CODE_A, 1),),))
    assert out == pcs and notes == ("Python frames not shown: read after the sample, the "
                                    "thread ran 2 eval calls where the stack has 1",)
    # a native stack cut short, a read that failed
    assert merged(pcs, groups, whole=False) == (
        pcs, ("Python frames not shown: the native stack is incomplete",))
    assert merged(pcs, (), note="x") == (pcs, ("Python frames not shown: x",))
    # no eval frame and nothing read: nothing to say
    assert merged((0x5000, 0x6000), ()) == ((0x5000, 0x6000), ())


def test_merge_read_of_a_stack_copy_cut_short():
    """A recursion deeper than the stack copy: its eval frames pair with
    the innermost groups, the rest follow a mark of C frames left out."""
    pcs = (0x5000, 0x1010, 0x6000, 0x1020)         # C, eval, C, eval; the copy ends
    cut = python_frame_word(0, 0)                   # C frames left out
    inner, outer = ((CODE_A, 3),), ((CODE_B, 7),)
    main = ((CODE_B, 9),)
    out, notes = merged(pcs, (inner, outer, main), whole=False, copy_cut=True)
    assert notes == ()
    assert out == (0x5000, python_frame_word(CODE_A, 3), 0x6000, python_frame_word(CODE_B, 7),
                   cut, python_frame_word(CODE_B, 9))
    # the kernel left the chain's middle out (a PY_CUT word of count 40)
    # before the copy's second eval frame: it is not paired past that
    middle = ((0, 40),)
    out, notes = merged(pcs, (inner, middle, main), whole=False, copy_cut=True)
    assert out == (0x5000, python_frame_word(CODE_A, 3), 0x6000, cut,
                   python_frame_word(0, 40), python_frame_word(CODE_B, 9))
    # more eval frames than groups, or a copy cut and another note: not merged
    assert merged(pcs, (inner,), whole=False, copy_cut=True)[1] == (
        "Python frames not shown: the native stack is incomplete",)
