"""Python frames in the stacks of offcpu, latency --by-stack and memleak
(bpf/python.h's pass in offcpu.bpf.c, latency.bpf.c and memleak.bpf.c) on
tests/programs/python/waits.py, under every CPython 3.8-3.13 of pyenv and
Debian's python3.11 (attached with -p: py-spy cannot); and a short -c
Python command whose frames are all named.

The program waits for a line on stdin, runs its chain ROUNDS times, says
"done" and stays alive: every call is made while ustack traces, and its
code objects can still be read when ustack ends. Expected frames: the
chain's functions, each at the line of its call in the file."""
from __future__ import annotations

import glob
import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import DEBIAN_PYTHON, finish, parse_trace, run_ustack, start_ustack, stop, wait_tracing

pytestmark = pytest.mark.kernel

PROG = Path(__file__).resolve().parent / "programs" / "python" / "waits.py"
ROUNDS, BLOCK = 20, 4096            # waits.py's
DEBIAN_PYTHON = "/usr/bin/python3.11"
# one of each way an eval call holds Python frames (one each up to 3.10,
# is_entry on 3.11, a C-stack shim from 3.12) and Debian's stripped static
# one: the per-version layouts are the profile tests' (test_python_frames)
PYTHONS = ("3.8", "3.11", "3.13", DEBIAN_PYTHON)
EVAL = "_PyEval_EvalFrameDefault"


def interpreter(which: str) -> str:
    if which.startswith("/"):
        if not Path(which).exists():
            pytest.skip(f"{which} is not installed")
        return which
    found = sorted(glob.glob(f"/root/.pyenv/versions/{which}.*/bin/python3"))
    if not found:
        pytest.skip(f"no CPython {which} under /root/.pyenv/versions")
    return found[-1]


def line_of(code: str) -> int:
    """The line of waits.py that is `code` (stripped)."""
    lines = [i for i, text in enumerate(PROG.read_text().splitlines(), 1)
             if text.strip() == code]
    assert len(lines) == 1, (code, lines)
    return lines[0]


def chain(innermost: str, call: str, leaf_call: str) -> list:
    """(function, line) of the Python frames, innermost first."""
    return [(innermost, line_of(call)), ("leaf", line_of(leaf_call)),
            ("middle", line_of("return leaf(mode)")), ("outer", line_of("return middle(mode)")),
            ("main", line_of("outer(mode)")),
            ("<module>", line_of("main(sys.argv[1], sys.argv[2], ROUNDS_GIVEN)"))]


NAP = chain("nap", "time.sleep(0.002)", "return nap()")
ASK = chain("ask", "return os.getppid()", "ask()")
GRAB = chain("grab", "kept.append(libc.malloc(BLOCK))", "grab()")


def attached(python: str, mode: str, *args) -> tuple:
    """`ustack ARGS -p PID` on waits.py MODE, ended by Ctrl-C once the
    program has done its rounds: (ustack's stdout, stderr, the facts)."""
    target = subprocess.Popen([python, str(PROG), mode, "-"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(target.stdout.readline())
        us = start_ustack(*args, "-p", str(facts["pid"]), stdout=subprocess.PIPE)
        try:
            wait_tracing(us, timeout=60)
            target.stdin.write("go\n")
            target.stdin.flush()
            assert target.stdout.readline() == "done\n"
            us.send_signal(signal.SIGINT)
            out, err = finish(us, 60)
        finally:
            stop(us)
        assert us.returncode == 0, err
    finally:
        target.stdin.close()
        stop(target)
    return out, err, facts


def python_frames(frames: list) -> list:
    """(function, line) of a JSON stack's Python frames, innermost first."""
    return [(f["function"], f["line"]) for f in frames if f["kind"] == "python"]


def stacks_with(doc: dict, pid: int, function: str) -> list:
    """The JSON stacks of pid holding a Python frame of `function`."""
    return [s for s in doc["stacks"] if s["pid"] == pid
            and any(f["kind"] == "python" and f["function"] == function for f in s["frames"])]


def unnamed_own(text: str, facts: dict) -> list:
    """The program's own code objects left unnamed in ustack's output (a
    module body run by an import is freed at once, and may be gone before
    anyone reads it)."""
    return [a for a in facts["codes"].values() if f"[python code {a:#x}]" in text]


def assert_whole(frames: list, expected: list, notes=()) -> None:
    """The Python frames exactly `expected`, no eval loop frame left in
    their place, the native frames whole to _start; a stack the walk cut
    (a note says why: off-CPU, the memory map may be locked) has the
    innermost of them."""
    names = [f["function"] for f in frames]
    found = python_frames(frames)
    assert EVAL not in names, names
    if notes:
        assert found == expected[:len(found)], (names, notes)
        return
    assert found == expected, names
    assert names[-1] == "_start", names


@pytest.mark.parametrize("python", PYTHONS)
def test_offcpu_python_frames(python):
    # sleeping only: a preemption may catch nap anywhere (taking the GIL back)
    out, err, facts = attached(interpreter(python), "sleep", "offcpu", "--state", "S",
                               "-f", "json")
    naps = stacks_with(json.loads(out), facts["pid"], "nap")
    # the whole Python chain, whether or not the native walk past it was
    # cut: off-CPU (interrupts off) the walk may find the memory map locked
    # for every nap of a run, a few frames from _start
    assert [s for s in naps if python_frames(s["frames"]) == NAP], err
    for s in naps:
        assert_whole(s["frames"], NAP, s["notes"])
        assert s["frames"][0]["module"] == "libc.so.6", s["frames"][0]  # the sleep's call
    assert not unnamed_own(out, facts), err


def test_offcpu_no_python_shows_the_interpreter():
    out, _err, facts = attached(interpreter("3.11"), "sleep", "offcpu", "-f", "json",
                                "--no-python")
    mine = [s for s in json.loads(out)["stacks"] if s["pid"] == facts["pid"]]
    assert not any(f["kind"] == "python" for s in mine for f in s["frames"])
    assert any(f["function"] == EVAL for s in mine for f in s["frames"])


# latency's text: a histogram's title, its stack's frames, its buckets
TITLE = re.compile(r"^(\S+): count (\d+), min \S+, avg \S+, max \S+$")
FRAME = re.compile(r"^  (\S+) \[([^\]]+)\](?: (.+):(\d+))?$")


def histograms(out: str) -> list:
    """[(count, frames: [{function, kind, line}] innermost first)]."""
    found = []
    for line in out.splitlines():
        if m := TITLE.match(line):
            found.append((int(m.group(2)), []))
        elif m := FRAME.match(line):
            python = m.group(2) == "python"
            found[-1][1].append({"function": m.group(1), "kind": "python" if python else None,
                                 "line": int(m.group(4)) if python and m.group(4) else None})
    return found


@pytest.mark.parametrize("python", PYTHONS)
def test_latency_by_stack_python_frames(python):
    out, err, facts = attached(interpreter(python), "getppid", "latency", "--by-stack",
                               "uprobe:libc:getppid")
    hists = histograms(out)
    assert sum(n for n, _frames in hists) == ROUNDS, out
    for _n, frames in hists:
        assert frames[0]["function"] == "getppid", frames
        assert_whole(frames, ASK)
    assert not unnamed_own(out, facts), err


def test_latency_slower_python_frames(tmp_path):
    """--slower's records share latency's ring with those of new code
    objects: each slow call's stack has its Python frames, named."""
    python, facts = interpreter("3.11"), tmp_path / "facts.json"
    res = run_ustack("latency", "--slower", "0", "uprobe:libc:getppid",
                     "-c", f"{python} {PROG} getppid {facts} 3")
    assert res.returncode == 3, res.stderr
    calls = parse_trace(res.stdout)
    assert len(calls) == 3, res.stdout
    for call in calls:
        frames = [{"function": f["func"], "kind": "python" if f["module"] == "python" else None,
                   "line": f.get("line")} for f in call["frames"]]
        assert frames[0]["function"] == "getppid", frames
        assert_whole(frames, ASK, call["notes"])


@pytest.mark.parametrize("python", PYTHONS)
def test_memleak_python_frames(python):
    out, err, facts = attached(interpreter(python), "leak", "memleak", "-f", "json")
    grabs = stacks_with(json.loads(out), facts["pid"], "grab")
    assert sum(s["count"] for s in grabs) == ROUNDS * BLOCK, out
    for s in grabs:
        assert s["frames"][0]["function"] == "malloc", s["frames"][0]
        assert_whole(s["frames"], GRAB, s["notes"])


# --- a short -c command: its frames all named -----------------------------------

def short_command(tmp_path, python: str, mode: str, *args) -> tuple:
    """`ustack ARGS -f json -c 'PYTHON waits.py MODE FACTS ROUNDS'`: the
    program runs its chain ROUNDS times and exits, ~100 ms, as it would
    alone (its status 3, ustack's; "bye" on stderr): (the stacks, ustack's
    stderr, the facts). Not once: the first milliseconds of a -c command
    may pass before ustack has read where its interpreter is mapped (its
    first samples then have no Python frame), as in any run of a program
    that starts as ustack does."""
    facts = tmp_path / "facts.json"
    us = start_ustack(*args, "-f", "json", "-c", f"{python} {PROG} {mode} {facts} {ROUNDS}",
                      stdout=subprocess.PIPE)
    try:
        out, err = finish(us, 60)
    finally:
        stop(us)
    assert us.returncode == 3 and "bye" in err.splitlines(), err
    stacks = ([json.loads(line) for line in out.splitlines()] if args[0] == "trace"
              else json.loads(out)["stacks"])       # trace: an event a line
    return stacks, err, json.loads(facts.read_text())


@pytest.mark.parametrize("command", ["offcpu", "trace", "memleak"])
def test_short_command_frames_all_named(tmp_path, command):
    """The command may exit before ustack has read the ring's records of
    its code objects: it is held at its exit until they are read, then
    exits as it would have."""
    mode, args, innermost, expected = {
        "offcpu": ("sleep", ("offcpu",), "nap", NAP),
        "trace": ("getppid", ("trace", "uprobe:libc:getppid"), "ask", ASK),
        "memleak": ("leak", ("memleak",), "grab", GRAB)}[command]
    stacks, err, facts = short_command(tmp_path, interpreter("3.12"), mode, *args)
    mine = [s for s in stacks if s["pid"] == facts["pid"]]
    unnamed = unnamed_own(json.dumps(mine), facts)
    assert not unnamed, (unnamed, err)
    chains = [s for s in mine if any(f["function"] == innermost for f in s["frames"])]
    assert chains
    for s in chains:
        assert_whole(s["frames"], expected, s.get("notes"))


def test_an_interpreter_is_known_by_its_object():
    """An interpreter object (libpython, the python executable) gets a
    slot of Python facts as its rows load, whichever process maps it; any
    other object gets none."""
    from ustack.capture.bpf_python import PythonMaps, PythonProcs
    maps = PythonMaps(objects=4, threads=4, codes=4)
    try:
        procs = PythonProcs(maps)
        libpython = glob.glob(str(Path(interpreter("3.12")).parent.parent / "lib" / "libpython3.12.so*"))
        assert procs.slot_of(DEBIAN_PYTHON) == 1
        if libpython:
            assert procs.slot_of(libpython[0]) == 2
        assert procs.slot_of("/bin/sh") == 0
        assert maps.python_objects.lookup((0).to_bytes(4, "little")) != bytes(
            maps.python_objects.value_size)
    finally:
        maps.close()
