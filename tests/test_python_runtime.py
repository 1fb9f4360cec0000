"""unwind/python_runtime.py: the interpreter of a process and its state
layout, judged two ways: against the DWARF of each installed CPython (gdb
reads the real structures) and by following the layout through a live
process's memory to the thread and frames it says it is in."""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from ustack.kernel import procfs
from ustack.unwind import python_runtime as pr

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "python", "state_probe.py")
PYENV = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))
INTERPRETERS = [p for p in PYENV
                if tuple(map(int, p.split("/")[4].split(".")[:2])) in pr.LAYOUTS]
if os.path.exists("/usr/bin/python3.11"):
    INTERPRETERS.append("/usr/bin/python3.11")

# the layout's fields as C expressions over the interpreter's own types, per version
_THREADS = {(3, 8): "tstate_head", (3, 9): "tstate_head", (3, 10): "tstate_head"}
_FRAME_TYPE = {(3, 8): "struct _frame", (3, 9): "struct _frame", (3, 10): "struct _frame"}


def _expressions(version):
    frame = _FRAME_TYPE.get(version, "struct _PyInterpreterFrame")
    tstate_frame = {(3, 11): "cframe", (3, 12): "cframe", (3, 13): "current_frame"}.get(version, "frame")
    e = {"runtime_interp_head": "((_PyRuntimeState*)0)->interpreters.head",
         "interp_tstate_head": "((PyInterpreterState*)0)->" + _THREADS.get(version, "threads.head"),
         "tstate_next": "((PyThreadState*)0)->next",
         "tstate_thread_id": "((PyThreadState*)0)->thread_id",
         "tstate_frame": f"((PyThreadState*)0)->{tstate_frame}"}
    if version <= (3, 10):
        e.update(frame_previous=f"(({frame}*)0)->f_back", frame_code=f"(({frame}*)0)->f_code",
                 frame_instr=f"(({frame}*)0)->f_lasti")
    else:
        code = "f_executable" if version >= (3, 13) else "f_code"
        instr = "instr_ptr" if version >= (3, 13) else "prev_instr"
        entry = "is_entry" if version == (3, 11) else "owner"
        e.update(frame_previous=f"(({frame}*)0)->previous", frame_code=f"(({frame}*)0)->{code}",
                 frame_instr=f"(({frame}*)0)->{instr}", frame_entry=f"(({frame}*)0)->{entry}",
                 code_bytecode="((PyCodeObject*)0)->co_code_adaptive")
        if version in ((3, 11), (3, 12)):
            e["cframe_current_frame"] = "((struct _PyCFrame*)0)->current_frame"
    return e


@pytest.mark.skipif(not shutil.which("gdb"), reason="gdb (the DWARF oracle) is not installed")
@pytest.mark.parametrize("python", PYENV or ["none"])
def test_layout_matches_the_builds_dwarf(python):
    if python == "none":
        pytest.skip("no CPython under /root/.pyenv/versions")
    version = tuple(map(int, python.split("/")[4].split(".")[:2]))
    if version not in pr.LAYOUTS:
        pytest.skip(f"CPython {version} has no layout (3.8-3.13 have)")
    libs = glob.glob(os.path.join(os.path.dirname(python), "..", "lib", "libpython3*.so.1.0"))
    if not libs:
        pytest.skip(f"{python} has no libpython with debug info beside it")
    expressions = _expressions(version)
    args = [a for name in expressions for a in ("-ex", f"print (unsigned long)&({expressions[name]})")]
    out = subprocess.run(["gdb", "-q", "-batch", *args, libs[0]], capture_output=True,
                         text=True, check=True).stdout
    dwarf = dict(zip(expressions, (int(line.split("= ")[1]) for line in out.splitlines()
                                   if line.startswith("$"))))
    assert len(dwarf) == len(expressions), out
    layout = pr.LAYOUTS[version]
    assert {name: layout[name] for name in dwarf} == dwarf


def _read(pid, address, size):
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(address)
        return f.read(size)


def _word(pid, address):
    return struct.unpack("<Q", _read(pid, address, 8))[0]


@pytest.mark.parametrize("python", INTERPRETERS or ["none"])
def test_the_layout_leads_to_the_waiting_thread_and_its_frames(python):
    """From _PyRuntime, by the layout alone, to the PyThreadState whose
    thread_id is the thread's own, then its current frame's code objects:
    wait_here's, then caller's, as the program saw them."""
    if python == "none":
        pytest.skip("no CPython installed")
    proc = subprocess.Popen([python, PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        said = json.loads(proc.stdout.readline())
        interp = pr.find_interpreter(procfs.executable_mappings(proc.pid))
        assert interp is not None
        assert interp.version == tuple(said["version"])
        assert interp.runtime == said["runtime"]
        assert any(lo <= said["eval"] < hi for lo, hi in interp.eval_ranges)
        f = dict(interp.layout)
        head = _word(proc.pid, interp.runtime + f["runtime_interp_head"])
        tstate = _word(proc.pid, head + f["interp_tstate_head"])
        while tstate and _word(proc.pid, tstate + f["tstate_thread_id"]) != said["ident"]:
            tstate = _word(proc.pid, tstate + f["tstate_next"])
        assert tstate, "no thread state has the waiting thread's id"
        frame = _word(proc.pid, tstate + f["tstate_frame"])
        if f["cframe_current_frame"] != pr.NONE:
            frame = _word(proc.pid, frame + f["cframe_current_frame"])
        codes = []
        while frame and len(codes) < 2:
            codes.append(_word(proc.pid, frame + f["frame_code"]))
            frame = _word(proc.pid, frame + f["frame_previous"])
        assert codes == said["codes"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


def test_a_process_without_python_has_no_interpreter():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        procfs_maps = procfs.executable_mappings(proc.pid)
        assert pr.find_interpreter(procfs_maps) is None
    finally:
        proc.kill()
        proc.wait()
