"""Python frames inside native stacks (bpf/python.h, capture/bpf_python.py):
`ustack profile` / `count` on tests/programs/python/frames.py under every
CPython 3.8-3.13 of pyenv, and Debian's python3.11 attached with -p.

A frame of the program is known by its code object: the program writes
id(f.__code__) of each function, and a Python frame's callchain word
carries that address (model.python_frame_parts); a frame named by the
symbolizer is known by its name (the file's frames, module frames.py).
Oracle: py-spy record -f raw on the same program (the Python chain it
sees most)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import (DEBIAN_PYTHON, EVAL, MIN_SAMPLES, natives_between_leaf_and_key, PROG, TAILS, chains, finish,
                     popen_ustack, pyenv_python, python_only, run_for_cpu, start_ustack, start_waiting,
                     stop, wait_tracing)
from helpers import PY_CHAIN as CHAIN
from ustack.model import python_frame_parts

pytestmark = pytest.mark.kernel

VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13")


def py_spy() -> str:
    path = Path(sys.executable).parent / "py-spy"
    if not path.exists():
        pytest.skip("py-spy is not installed (pip install -e '.[test]')")
    return str(path)


def profile_json(argv: list, *args, timeout: float = 90) -> list:
    """`ustack profile -f json ARGS -c ARGV`'s stacks."""
    cmd = " ".join(argv)
    proc = popen_ustack("profile", "-F", "199", "-f", "json", *args, "-c", cmd,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = finish(proc, timeout)
    assert proc.returncode == 0, err
    return json.loads(out)["stacks"]


def run_program(tmp_path: Path, python: str, mode: str, *args, seconds: str = "1") -> tuple:
    """(stacks, facts) of a profile of frames.py MODE run by `python`."""
    facts = tmp_path / "facts.json"
    stacks = profile_json([python, str(PROG), mode, seconds, str(facts)], *args)
    return stacks, json.loads(facts.read_text())


def in_python(frames: list) -> bool:
    """A sample of Python code: a Python frame, or the eval loop's C frame."""
    return any(py is not None or native == EVAL for py, native in frames)


def share(stacks: list, facts: dict, full) -> tuple:
    """(samples of the program's main() whose frames pass `full`, samples of
    its main(), samples in the eval loop without a Python frame). Start-up
    (imports before main) is not judged: the first samples of a -c command
    come before ustack has read where its interpreter was mapped."""
    good = total = unmerged = 0
    for frames, n in chains(stacks, facts):
        seq = python_only(frames)
        if "main" in seq or "threaded" in seq:
            total += n
            good += n if full(frames) else 0
        elif not seq and in_python(frames):
            unmerged += n
    return good, total, unmerged


def full_chain(tail: list):
    """Whether a sample's Python frames are CHAIN then a prefix of `tail`."""
    def full(frames):
        seq = python_only(frames)
        return seq[:len(CHAIN)] == CHAIN and seq[len(CHAIN):] == tail[:len(seq) - len(CHAIN)]
    return full


def assert_share(stacks: list, facts: dict, full, at_least: float = 0.95,
                 unmerged_at_most: float = 0.2) -> None:
    good, total, unmerged = share(stacks, facts, full)
    common = Counter()
    for frames, n in chains(stacks, facts):
        common[";".join(str(p) for p in python_only(frames))] += n
    assert total >= MIN_SAMPLES and good >= at_least * total, (
        f"{good} of {total} samples show the whole chain; most common: "
        f"{common.most_common(4)}")
    assert unmerged <= unmerged_at_most * total, \
        f"{unmerged} samples of the eval loop had no Python frame"


# --- every version: the chain, in order, where the program is --------------------

@pytest.mark.parametrize("mode", sorted(set(TAILS) - {"sorted"}))   # sorted: with py-spy
@pytest.mark.parametrize("version", VERSIONS)
def test_profile_shows_python_chain(tmp_path, version, mode):
    stacks, facts = run_program(tmp_path, pyenv_python(version), mode)
    assert facts["version"] == [int(x) for x in version.split(".")]
    assert_share(stacks, facts, full_chain(TAILS[mode]))


@pytest.mark.parametrize("version", VERSIONS)
def test_threads_each_in_their_function(tmp_path, version):
    stacks, facts = run_program(tmp_path, pyenv_python(version), "threads")
    seen = Counter()
    for frames, n in chains(stacks, facts):
        seq = python_only(frames)
        if "threaded" in seq:
            seen[tuple(seq[seq.index("threaded"):])] += n
    for work in ("work_a", "work_b", "work_c"):
        assert sum(n for tail, n in seen.items() if tail[:2] == ("threaded", work)) > 10, seen

    def full(frames):
        seq = python_only(frames)
        return "threaded" in seq and seq[seq.index("threaded") + 1:seq.index("threaded") + 3] \
            in (["work_a", "spin"], ["work_b", "spin"], ["work_c", "spin"],
                ["work_a"], ["work_b"], ["work_c"])
    assert_share(stacks, facts, full)


# --- py-spy sees the same chain ---------------------------------------------------

def py_spy_chains(tmp_path: Path, python: str, mode: str) -> Counter:
    """py-spy record -f raw on frames.py: Python function names, outermost
    first, of the program's own file, counted."""
    out = tmp_path / "spy.txt"
    run = subprocess.run([py_spy(), "record", "-f", "raw", "-o", str(out), "-r", "99", "--",
                          python, str(PROG), mode, "1", str(tmp_path / "spy-facts.json")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found = Counter()
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        names = tuple(f.rsplit(" (", 1)[0] for f in stack.split(";")
                      if f.endswith(")") and "(frames.py:" in f)
        found[names] += int(n)
    return found


@pytest.mark.parametrize("version", VERSIONS)
def test_sorted_as_py_spy_sees_it_with_its_c_frame_between(tmp_path, version):
    """py-spy's most common chain is ours, as whole as py-spy's; sorted() is
    C: its frame stays between leaf and the key function it calls back, and
    every eval loop C frame that ran a Python frame gave way to it (one left
    is the innermost call, starting or ending)."""
    python = pyenv_python(version)
    spy = py_spy_chains(tmp_path, python, "sorted")
    stacks, facts = run_program(tmp_path, python, "sorted")
    assert facts["version"] == [int(x) for x in version.split(".")]
    assert_share(stacks, facts, full_chain(TAILS["sorted"]))
    between = natives_between_leaf_and_key(chains(stacks, facts))
    (natives, _n), = between.most_common(1)
    assert "builtin_sorted" in natives, between.most_common(3)
    ours = Counter()
    for frames, n in chains(stacks, facts):
        ours[tuple(python_only(frames))] += n
    assert ours.most_common(1)[0][0] == spy.most_common(1)[0][0] == tuple(
        CHAIN + TAILS["sorted"]), (ours.most_common(3), spy.most_common(3))
    spy_total = sum(n for names, n in spy.items() if "main" in names)   # as share()
    spy_full = sum(n for names, n in spy.items() if list(names[:len(CHAIN)]) == CHAIN)
    good, total, _unmerged = share(stacks, facts, full_chain(TAILS["sorted"]))
    assert good / total >= 0.95 * spy_full / spy_total, (good, total, spy_full, spy_total)


# --- attached to Debian's static python3.11 (py-spy cannot) -----------------------

def attached(python: str, mode: str, *args) -> tuple:
    if not Path(python).exists():
        pytest.skip(f"{python} is not installed")
    proc, facts = start_waiting(python, mode)
    try:
        run = run_for_cpu(facts["pid"], *args, "-f", "json")
        out, err = run.stdout, run.stderr
        assert run.returncode == 0, err
    finally:
        proc.stdin.close()
        stop(proc)
    return json.loads(out)["stacks"], facts


def test_attached_to_debian_python():
    stacks, facts = attached(DEBIAN_PYTHON, "busy", "profile", "-F", "199")
    assert facts["version"] == [3, 11]
    assert_share(stacks, facts, full_chain(TAILS["busy"]))


@pytest.mark.parametrize("python", ["3.11", DEBIAN_PYTHON])
def test_count_uprobe_under_python(python):
    """A uprobe in C code Python called (libc's write under print) shows
    the Python frames above it."""
    python = pyenv_python(python) if python[0].isdigit() else python
    stacks, facts = attached(python, "write", "count", "uprobe:libc:write")
    ours = [(frames, n) for frames, n in chains(stacks, facts)]
    total = sum(n for _f, n in ours)
    good = sum(n for frames, n in ours if python_only(frames) == CHAIN
               and frames[-1][1] == "write")
    assert total >= MIN_SAMPLES and good >= 0.95 * total, [
        (python_only(f), f[-1], n) for f, n in ours[:3]]


def test_system_wide_finds_a_python_started_later(tmp_path):
    """A system-wide run: a Python process started after ustack is live
    gets its Python frames once ustack has read where its interpreter is
    mapped (its first samples may come before: the machine's other
    processes' records are read too)."""
    python, facts = pyenv_python("3.12"), tmp_path / "facts.json"
    us = start_ustack("profile", "-F", "199", "-f", "json", stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        prog = subprocess.run([python, str(PROG), "busy", "2", str(facts)], timeout=60)
        assert prog.returncode == 0
        us.send_signal(signal.SIGINT)       # the program has ended: so may the run
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    facts = json.loads(facts.read_text())
    mine = [s for s in json.loads(out)["stacks"] if s["pid"] == facts["pid"]]
    assert_share(mine, facts, full_chain(TAILS["busy"]), unmerged_at_most=1)


# --- code objects are read while the process lives ---------------------------------

def test_code_objects_named_after_the_process_ended(tmp_path):
    """Each code object the kernel reports is read at once: its frames are
    named after the program has exited."""
    from ustack import Options, Session
    python, facts = pyenv_python("3.12"), tmp_path / "facts.json"
    session = Session(Options(command="profile", events=["profile:hz:199"],
                              cmdline=f"{python} {PROG} generator 1 {facts}"))
    code = session.python_code
    with session:
        session.run_through()           # until the command exits
        counted = session.capture.counted()
    pid = json.loads(facts.read_text())["pid"]
    assert not Path(f"/proc/{pid}").exists()
    named = Counter()
    for sample, n in counted:
        words = [int.from_bytes(sample.callchain[i:i + 8], "little")
                 for i in range(0, len(sample.callchain), 8)]
        names = [code.frame(pid, *parts).function
                 for w in reversed(words) if (parts := python_frame_parts(w))]
        named[tuple(names)] += n
    assert named.most_common(1)[0][0] == tuple(CHAIN + TAILS["generator"]), \
        named.most_common(3)
    # the program's frames all named (a module body run by an import, whose
    # code object is freed at once, may be gone before it is read)
    assert not [k for k in named if "main" in k and any("[python code" in f for f in k)]


def test_code_identity_fields_agree_with_the_symbolizer():
    """The kernel tells code objects apart by the fields the symbolizer
    names them by (file, qualified name)."""
    from ustack.symbols.python import CODE_OFFSETS
    from ustack.unwind.python_runtime import code_identity
    for version, offsets in CODE_OFFSETS.items():
        name = offsets["qualname"] if offsets["qualname"] is not None else offsets["name"]
        assert code_identity(version) == (offsets["filename"], name), version
    assert code_identity((3, 7)) == (0, 0)


def test_no_python_shows_the_interpreter(tmp_path):
    """--no-python: the eval loop's C frames, no Python frame."""
    stacks, facts = run_program(tmp_path, pyenv_python("3.11"), "busy", "--no-python",
                                seconds="1")
    frames = [f for frames, _n in chains(stacks, facts) for f in frames]
    assert not any(py is not None for py, _native in frames)
    assert sum(1 for _py, native in frames if native == EVAL) > 10
