"""Python frames from a callchain to every output: the symbolizer names a
tagged word (model.python_frame_word) by the process's code object; the
reports show it as a Python frame (folded as py-spy's raw output, text
with file:line, pprof with function, file and line, speedscope with file
and line, JSON with its kind)."""
import json
import os
import re
import subprocess
import sys

import pytest

from ustack.kernel import procfs
from ustack.model import (CommEvent, Frame, Losses, Mapping, MmapEvent, Piece, RawSample, Stack,
                          StackCount, python_frame_word)
from ustack.recording.writer import Recorder, RecordWriter
from ustack.report.counts import format_counts
from ustack.report.folded import format_folded
from ustack.report.formats import ReportContext, stack_report
from ustack.report.text import format_stack
from ustack.session import Session
from ustack.symbols.python import PythonCode
from ustack.symbols.stacks import StackResolver
from ustack.target.mappings import MappingTracker
from ustack.unwind import python_runtime as pr

from helpers import INTERPRETERS, PROGRAM, pprof, render, svg_frames, traces, write_report

SPY_PROGRAM = """def leaf(n):
    s = 0
    for i in range(n):
        s += i
    return s

class K:
    def m(self):
        return leaf(200000)

for _ in range(100):
    K().m()
"""


def py(function, file, line):
    return Frame(addr=0, module=os.path.basename(file), function=function, file=file,
                 line=line, kind="python")


MAIN = Frame(addr=0x401000, module="python3.12", function="main", offset=0x10,
             path="/usr/bin/python3.12")
EVAL = Frame(addr=0x7f0000001000, module="libpython3.12.so.1.0",
             function="_PyEval_EvalFrameDefault", offset=0x40,
             path="/usr/lib/libpython3.12.so.1.0")
# innermost first: leaf called by K.m called by <module>, run by the eval loop
STACK = Stack((py("leaf", "/srv/app/spy.py", 4), py("K.m", "/srv/app/spy.py", 9),
               py("<module>", "/srv/app/spy.py", 12), EVAL, MAIN))


@pytest.fixture
def target(tmp_path):
    python = next((p for p in INTERPRETERS if "/.pyenv/" in p), None)
    if python is None:
        pytest.skip("no pyenv CPython 3.8-3.13 under /root/.pyenv/versions")
    proc = subprocess.Popen([python, PROGRAM, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(proc.stdout.readline()), proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_tagged_words_become_python_frames(target):
    """A callchain of the in-kernel walk's shape: Python frames where the
    eval loop's C frame was, then the eval loop's caller (a return address:
    named at addr - 1, as after any frame but the leaf)."""
    facts, proc = target
    waiting = facts["waiting"]
    method = next(c for c in facts["codes"] if c["label"] == "method")
    interp = pr.find_interpreter(procfs.executable_mappings(proc.pid))
    # the eval function's end: as a return address (named at end - 1) the
    # eval function, as an exact pc the code after it
    start, end = max(interp.eval_ranges, key=lambda r: r[1] - r[0])
    words = [python_frame_word(waiting["code"], waiting["index"]),
             python_frame_word(method["code"], method["lines"][-1][0]), end]
    tracker = MappingTracker()
    tracker.seed_from_proc(proc.pid)
    chain = b"".join(w.to_bytes(8, "little") for w in words)
    stack = StackResolver(tracker).stack(RawSample(0, proc.pid, proc.pid, 0, 0, chain))
    first, second, native = stack.frames
    assert (first.function, first.file, first.line, first.kind) == \
        ("wait_here", PROGRAM, waiting["line"], "python")
    name = "C.m" if tuple(facts["version"]) >= (3, 11) else "m"
    assert (second.function, second.line, second.module) == \
        (name, method["lines"][-1][1], "code_names.py")
    assert (native.function, native.offset, native.kind) == \
        ("_PyEval_EvalFrameDefault", end - start, "")


def test_folded_is_py_spy_raw(tmp_path):
    """py-spy's raw output (`func (file.py:LINE)` frames, root first): the
    same frames folded by ustack give the same line."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        pytest.skip("py-spy (the oracle) is not installed in this venv")
    program = tmp_path / "spy.py"
    program.write_text(SPY_PROGRAM)
    out = tmp_path / "raw.txt"
    subprocess.run([spy, "record", "-f", "raw", "-o", str(out), "-r", "99", "--",
                    sys.executable, str(program)], check=True, capture_output=True, timeout=120)
    line = next(ln for ln in out.read_text().splitlines() if ";leaf (" in ln)
    spied, _count = line.rsplit(" ", 1)
    frames = []
    for part in spied.split(";"):
        m = re.fullmatch(r"(.+) \((.+):(\d+)\)", part)
        frames.append(py(m[1], str(tmp_path / m[2]), int(m[3])))
    ours = format_folded([StackCount("python3", 1, Stack(tuple(reversed(frames))), 3)])
    assert ours == f"python3;{spied} 3\n"
    assert spied.startswith("<module> (spy.py:") and ";K.m (spy.py:9);leaf (spy.py:" in spied


def test_folded_keeps_the_native_frames_around():
    assert format_folded([StackCount("python3", 7, STACK, 5)]) == (
        "python3;main;_PyEval_EvalFrameDefault;<module> (spy.py:12);K.m (spy.py:9);"
        "leaf (spy.py:4) 5\n")


def test_text_shows_function_file_and_line():
    lines = format_stack(STACK).splitlines()
    assert lines[:3] == ["                    : leaf [python] /srv/app/spy.py:4",
                         "                    : K.m [python] /srv/app/spy.py:9",
                         "                    : <module> [python] /srv/app/spy.py:12"]
    assert lines[3] == (" 0x00007f0000001000 : _PyEval_EvalFrameDefault+0x40 "
                        "[libpython3.12.so.1.0]")
    counts = format_counts([StackCount("python3", 7, STACK, 5)]).splitlines()
    assert counts[:4] == ["  leaf [python] /srv/app/spy.py:4", "  K.m [python] /srv/app/spy.py:9",
                          "  <module> [python] /srv/app/spy.py:12",
                          "  _PyEval_EvalFrameDefault [libpython3.12.so.1.0]"]


def test_lines_of_one_function_are_apart():
    """Two samples in one function at two lines stay two stacks (py-spy's
    raw output does the same)."""
    other = Stack((py("leaf", "/srv/app/spy.py", 5),) + STACK.frames[1:])
    folded = format_folded([StackCount("python3", 7, STACK, 5),
                            StackCount("python3", 7, other, 2)])
    assert [ln.split(";")[-1] for ln in folded.splitlines()] == \
        ["leaf (spy.py:5) 2", "leaf (spy.py:4) 5"]


def test_pprof_carries_function_file_and_line(tmp_path):
    context = ReportContext(command="count", events=("profile:hz:99",))
    path = write_report("pprof", [StackCount("python3", 7, STACK, 5)],
                        tmp_path / "py.pb.gz", context)
    # a Python frame is a location of no mapping (address 0), with one line
    locations = pprof("-raw", path).split("\nLocations\n")[1].split("\nMappings\n")[0]
    assert [ln.split(": ", 1)[1] for ln in locations.splitlines()[:3]] == [
        "0x0 leaf /srv/app/spy.py:4 s=0(py::leaf:/srv/app/spy.py)",
        "0x0 K.m /srv/app/spy.py:9 s=0(py::K.m:/srv/app/spy.py)",
        "0x0 <module> /srv/app/spy.py:12 s=0(py::<module>:/srv/app/spy.py)"]
    (_value, names, _labels), = traces(path)
    assert names == ["leaf", "K.m", "<module>", "_PyEval_EvalFrameDefault", "main"]


def test_speedscope_and_json_carry_file_line_and_kind(tmp_path):
    context = ReportContext(command="count", events=("profile:hz:99",))
    path = write_report("speedscope", [StackCount("python3", 7, STACK, 5)],
                        tmp_path / "py.speedscope.json", context)
    frames = json.loads(path.read_text())["shared"]["frames"]
    assert {"name": "K.m", "file": "/srv/app/spy.py", "line": 9} in frames
    path = write_report("json", [StackCount("python3", 7, STACK, 5)], tmp_path / "py.json",
                        context)
    doc = json.loads(path.read_text())
    first = doc["stacks"][0]["frames"][0]
    assert (first["function"], first["file"], first["line"], first["kind"]) == \
        ("leaf", "/srv/app/spy.py", 4, "python")
    assert doc["stacks"][0]["frames"][3]["kind"] is None


def test_a_recording_keeps_the_python_names(target, tmp_path):
    """record writes what names each code object its stacks hold while the
    process lives; report, after the process is gone, names the frames
    from the file alone."""
    facts, proc = target
    waiting = facts["waiting"]
    unicode = next(c for c in facts["codes"] if c["label"] == "ucs4")
    tracker = MappingTracker()
    tracker.seed_from_proc(proc.pid)
    names = PythonCode()
    names.remember(proc.pid, waiting["code"], tuple(facts["version"]))
    words = [python_frame_word(waiting["code"], waiting["index"]),
             python_frame_word(unicode["code"], unicode["lines"][-1][0])]
    chain = b"".join(w.to_bytes(8, "little") for w in words)
    path = tmp_path / "run.ustack"
    recorder = Recorder(str(path), tracker, None, ["e"], ["fp"], "bpf", {},
                        python_code=names)
    recorder.add_piece(Piece([], [RawSample(0, proc.pid, proc.pid, 1, 0, chain)] * 2))
    recorder.close(Losses(), whole=True)
    proc.stdin.close()
    proc.wait(timeout=30)
    with Session.replay(str(path)) as session:
        events = list(session.events())
    assert len(events) == 2
    assert [(f.function, f.file, f.line, f.kind) for f in events[0].stack.frames] == [
        ("wait_here", PROGRAM, waiting["line"], "python"),
        ("𠀀", unicode["file"], unicode["lines"][-1][1], "python")]
    assert session.warnings == []


def test_a_recording_without_the_names_says_so(tmp_path):
    """A code object the file does not name is a placeholder in report,
    never read from whatever process has that pid now."""
    me = os.getpid()
    chain = python_frame_word(0x7f0000001000, 3).to_bytes(8, "little")
    path = tmp_path / "run.ustack"
    with RecordWriter(str(path), ["e"], ["fp"], "bpf") as writer:
        writer.add_piece(Piece([], [RawSample(0, me, me, 1, 0, chain)]))
    with Session.replay(str(path)) as session:
        events = list(session.events())
    assert [f.function for f in events[0].stack.frames] == ["[python code 0x7f0000001000]"]
    assert session.warnings == ["1 Python frames are shown as [python code 0x...]: the "
                                "recording does not name their code object"]


def test_a_counted_python_stack_keeps_its_exec_generation():
    """A stack counted in the kernel has no time: its generation is the one
    whose mappings hold its addresses; a Python frame's word is no address
    and must not make the stack look like the newest program's."""
    pid = 4242
    tracker = MappingTracker(live=False)
    tracker.apply(MmapEvent(pid, pid, Mapping(0x400000, 0x401000, 0, "/bin/python3")))
    tracker.apply(CommEvent(pid, pid, "other", True, 10))
    tracker.apply(MmapEvent(pid, pid, Mapping(0x800000, 0x801000, 0, "/bin/other")))
    words = [python_frame_word(0x7f0000001000, 3), 0x400100]
    chain = b"".join(w.to_bytes(8, "little") for w in words)
    generation = StackResolver(tracker).key(RawSample(0, pid, pid, 0, -1, chain))[1]
    assert generation == 0


def test_svg_colours_python_blue_and_jit_green():
    """flamegraph.pl's palettes and two of ustack's: Python frames blue,
    JIT frames (js, java) green, native code warm."""
    js = Frame(0x3a000, "", "JS:*add", kind="js")
    java = Frame(0x7f00, "", "LChain;::leaf", kind="java")
    counts = [StackCount("python3", 7, STACK, 5), StackCount("node", 8, Stack((js, MAIN)), 5),
              StackCount("java", 9, Stack((java, MAIN)), 5)]
    # titles: `name (N events, P%) [module]`; a Python frame's name ends in (file:line)
    rgb = {re.sub(r" \(\d+ events.*", "", title): tuple(map(int, re.findall(r"\d+", r["fill"])))
           for title, r, _ in svg_frames(render(stack_report("svg"), counts))}
    leaf = rgb["leaf (spy.py:4)"]
    assert leaf[2] > max(leaf[:2])                             # blue
    for name in ("JS:*add", "LChain;::leaf"):
        assert rgb[name][1] > max(rgb[name][0], rgb[name][2])  # green
    assert rgb["main"][0] > max(rgb["main"][1:])               # warm
