"""A Python process whose frame chain is damaged (tests/programs/python/
broken_chain.py breaks its own through ctypes): the frame walk, in the
kernel (bpf) and from user space after each sample (perf), shows what it
can and says what is wrong in one note: a chain that loops is shown up to
the loop, never as repeated frames, and the outer native frames stay; a
frame whose code object pointer holds garbage is not said to belong to
a process that ended while the process runs."""
from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import finish, parse_trace, pyenv_python, start_ustack, stop, wait_tracing

PROG = Path(__file__).resolve().parent / "programs" / "python" / "broken_chain.py"
CALLS = 3
LOOP_NOTES = {
    "bpf": "the Python frame chain loops back on itself (damaged memory): shown up to "
           "the loop, the interpreter calls past it as C frames",
    "perf": "Python frames not shown: the Python frame chain loops back on itself "
            "(damaged memory)",
}


def traced_calls(version: str, mode: str, backend: str) -> tuple:
    """(records, stderr) of `ustack trace syscall:getppid -p PID` on
    broken_chain.py MODE, which makes CALLS such calls with its chain
    broken (one per line it reads, each said), ended by Ctrl-C once they
    are made; then the program mends its chain and exits."""
    prog = subprocess.Popen([pyenv_python(version), str(PROG), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(prog.stdout.readline())     # the chain is broken by now
        run = start_ustack("trace", "syscall:getppid", "--backend", backend,
                           "-p", str(facts["pid"]), stdout=subprocess.PIPE)
        try:
            wait_tracing(run, timeout=60)
            prog.stdin.write("go\n" * CALLS)
            prog.stdin.flush()
            assert [prog.stdout.readline().strip() for _ in range(CALLS)] == \
                ["called"] * CALLS
            # the run ends while the process lives (its code objects are
            # named from its memory); then it mends its chain and ends
            run.send_signal(signal.SIGINT)
            out, err = finish(run, 60)
            prog.stdin.close()
            assert prog.stdout.readline().strip() == str(CALLS)
            assert prog.wait(timeout=30) == 0
        finally:
            stop(run)
        assert run.returncode == 0, err
    finally:
        stop(prog)
    records = parse_trace(out)
    assert len(records) == CALLS, out
    return records, err


def python_functions(record: dict) -> list:
    return [f["func"] for f in record["frames"] if f["module"] == "python"]


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["bpf", "perf"])
@pytest.mark.parametrize("version", ["3.11", "3.12"])
@pytest.mark.parametrize("mode", ["loop-self", "loop-ancestor"])
def test_a_looping_frame_chain_is_one_note_not_repeated_frames(mode, version, backend):
    records, _err = traced_calls(version, mode, backend)
    for rec in records:
        names = python_functions(rec)
        assert len(names) == len(set(names)), names
        assert rec["notes"] == [LOOP_NOTES[backend]], rec
        if backend == "bpf":        # shown up to the loop
            want = ["leaf"] if mode == "loop-self" else ["leaf", "middle_fn", "outer_fn"]
            assert names == want, rec["frames"]
        assert rec["frames"][-1]["func"] == "_start", rec["frames"]   # the outer native frames


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_a_code_object_pointer_to_garbage_is_not_said_to_be_a_process_that_ended(backend):
    records, err = traced_calls("3.12", "bad-code", backend)
    assert "process ended" not in err, err
    for rec in records:
        assert rec["frames"][-1]["func"] == "_start", rec["frames"]
    if backend == "bpf":            # the frame is shown, unnamed, and why is said
        for rec in records:
            names = python_functions(rec)
            assert names == ["leaf", "[python code, not read]", "outer_fn", "main",
                             "<module>"], names
        assert re.search(r"^ustack: \d+ Python frames are shown as \[python code, not read\]: "
                         r"their code object could not be read and checked while it was the "
                         r"one that ran \(freed, or the frame is damaged\)$", err, re.M), err
    else:                           # read after the sample: not shown, and why
        for rec in records:
            assert rec["notes"] == ["Python frames not shown: a frame's code object was "
                                    "not one when read (freed, or the frame is damaged)"], rec
