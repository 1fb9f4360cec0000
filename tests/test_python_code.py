"""symbols/python.py: code objects of live CPython processes named from
their memory (qualified name, file, line of each instruction), judged by
what the interpreter itself says of the same objects, and its offsets
against each build's DWARF (gdb) and 3.13's _Py_DebugOffsets."""
import glob
import json
import os
import shutil
import struct
import subprocess

import pytest

from ustack.kernel import procfs
from ustack.model import PYTHON_INDEX_MAX, PythonCodeInfo
from ustack.symbols import python as pc
from ustack.unwind import python_runtime as pr
from helpers import INTERPRETERS, PROGRAM, PYENV, _version


if os.path.exists("/usr/bin/python3.11"):
    INTERPRETERS.append("/usr/bin/python3.11")

# the names each code object must get: co_qualname from 3.11, co_name before
QUALNAMES = {"method": "C.m", "nested": "outer.<locals>.inner", "lambda": "<lambda>",
             "latin1": "café", "ucs2": "関数", "ucs4": "𠀀", "long": "long_function"}
NAMES = dict(QUALNAMES, method="m", nested="inner")


@pytest.fixture
def target(request, tmp_path):
    """(facts the target printed, its process), waiting on its stdin."""
    python = request.param
    if python == "none":
        pytest.skip("no CPython 3.8-3.13 under /root/.pyenv/versions or /usr/bin")
    proc = subprocess.Popen([python, PROGRAM, str(tmp_path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(proc.stdout.readline())
        yield facts, proc
    finally:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)


def _finish(proc):
    proc.stdin.close()
    proc.wait(timeout=30)


@pytest.mark.parametrize("target", INTERPRETERS or ["none"], indirect=True)
def test_names_files_and_every_line(target, tmp_path):
    facts, proc = target
    version = tuple(facts["version"])
    names = pc.PythonCode()
    expected = QUALNAMES if version >= (3, 11) else NAMES
    for code in facts["codes"]:
        names.remember(proc.pid, code["code"], version)
        first = names.frame(proc.pid, code["code"], 0)
        assert (first.function, first.file, first.kind, first.addr) == \
            (expected[code["label"]], code["file"], "python", 0)
        assert first.module == os.path.basename(code["file"])
        got = [[i, names.frame(proc.pid, code["code"], i).line] for i, _ in code["lines"]]
        assert got == code["lines"], code["label"]
    files = {c["label"]: c["file"] for c in facts["codes"]}
    assert files["ucs4"] == str(tmp_path / "módulo_名前_😀.py")
    assert files["method"] == PROGRAM
    # the long function's statements are > 255 lines apart (lnotab's steps)
    long = next(c for c in facts["codes"] if c["label"] == "long")
    lines = sorted({line for _, line in long["lines"]})
    assert lines[-1] - lines[0] > 2 * 300, lines


@pytest.mark.parametrize("target", INTERPRETERS or ["none"], indirect=True)
def test_the_waiting_frame_line(target):
    """The instruction a blocked frame is at (f_lasti, which the frame's
    prev_instr / instr_ptr gives on 3.11+) has the line Python reports."""
    facts, proc = target
    waiting = facts["waiting"]
    frame = pc.PythonCode().frame(proc.pid, waiting["code"], waiting["index"])
    assert (frame.function, frame.line) == ("wait_here", waiting["line"])


@pytest.mark.parametrize("target", INTERPRETERS[:1] or ["none"], indirect=True)
def test_names_outlive_the_process(target):
    facts, proc = target
    version = tuple(facts["version"])
    names = pc.PythonCode()
    kept, never = facts["codes"][0], facts["codes"][1]
    names.remember(proc.pid, kept["code"], version)
    _finish(proc)
    frame = names.frame(proc.pid, kept["code"], kept["lines"][-1][0])
    assert (frame.function, frame.line) == (NAMES[kept["label"]] if version < (3, 11)
                                            else QUALNAMES[kept["label"]], kept["lines"][-1][1])
    lost = names.frame(proc.pid, never["code"], 0)
    assert (lost.function, lost.kind, lost.line) == (f"[python code {never['code']:#x}]",
                                                    "python", 0)
    assert names.warnings == ["1 Python frames are shown as [python code 0x...]: their "
                              "process ended before ustack could read their code object"]


@pytest.mark.parametrize("target", INTERPRETERS[:1] or ["none"], indirect=True)
def test_unread_code_is_read_when_asked(target):
    """A code object the capture never reported is read at frame() time
    while its process lives (its version found from its mappings)."""
    facts, proc = target
    code = facts["codes"][0]
    frame = pc.PythonCode().frame(proc.pid, code["code"], PYTHON_INDEX_MAX)
    assert (frame.file, frame.line) == (code["file"], code["firstlineno"])


def test_a_version_without_layout_is_refused():
    with pytest.raises(ValueError, match="no code object layout for Python 3.7"):
        pc.read_code(os.getpid(), 0, (3, 7))


# -- the offsets against the builds ------------------------------------------------

def _gdb_offsets(lib, expressions):
    args = [a for e in expressions for a in ("-ex", f"print (unsigned long)({e})")]
    out = subprocess.run(["gdb", "-q", "-batch", *args, lib], capture_output=True,
                         text=True, check=True).stdout
    values = [int(line.split("= ")[1]) for line in out.splitlines() if line.startswith("$")]
    assert len(values) == len(expressions), out
    return values


@pytest.mark.skipif(not shutil.which("gdb"), reason="gdb (the DWARF oracle) is not installed")
@pytest.mark.parametrize("python", [p for p in PYENV if _version(p) in pc.CODE_OFFSETS] or ["none"])
def test_offsets_match_the_builds_dwarf(python):
    if python == "none":
        pytest.skip("no CPython 3.8-3.13 under /root/.pyenv/versions")
    version = _version(python)
    libs = glob.glob(os.path.join(os.path.dirname(python), "..", "lib", "libpython3*.so.1.0"))
    if not libs:
        pytest.skip(f"{python} has no libpython with debug info beside it")
    table = "co_lnotab" if version <= (3, 9) else "co_linetable"
    fields = {"firstlineno": "co_firstlineno", "filename": "co_filename",
              "name": "co_name", "table": table}
    if version >= (3, 11):
        fields["qualname"] = "co_qualname"
    code = [f"&((PyCodeObject*)0)->{f}" for f in fields.values()]
    others = ["sizeof(PyASCIIObject)", "sizeof(PyCompactUnicodeObject)",
              "&((PyASCIIObject*)0)->length", "&((PyVarObject*)0)->ob_size",
              "&((PyBytesObject*)0)->ob_sval"]
    values = _gdb_offsets(libs[0], code + others)
    ours = pc.CODE_OFFSETS[version]
    assert {name: ours[name] for name in fields} == dict(zip(fields, values))
    assert values[len(code):] == [*pc.UNICODE_HEADERS[version], pc.UNICODE_LENGTH,
                                  pc.BYTES_SIZE, pc.BYTES_DATA]


@pytest.mark.parametrize("target", [p for p in PYENV if _version(p) == (3, 13)] or ["none"],
                         indirect=True)
def test_offsets_match_313_debug_offsets(target):
    """3.13 states its offsets in _PyRuntime (_Py_DebugOffsets): the
    code object's, the bytes object's and the str object's."""
    facts, proc = target
    interp = pr.find_interpreter(procfs.executable_mappings(proc.pid))
    with open(f"/proc/{proc.pid}/mem", "rb") as f:
        f.seek(interp.runtime)
        debug = f.read(584)
    assert debug.startswith(b"xdebugpy")
    word = lambda at: struct.unpack_from("<Q", debug, at)[0]  # noqa: E731
    ours = pc.CODE_OFFSETS[(3, 13)]
    assert [ours[n] for n in ("filename", "name", "qualname", "table", "firstlineno")] == \
        [word(at) for at in (280, 288, 296, 304, 312)]
    assert (pc.BYTES_SIZE, pc.BYTES_DATA) == (word(520), word(528))
    assert (pc.UNICODE_STATE, pc.UNICODE_LENGTH, pc.UNICODE_HEADERS[(3, 13)][0]) == \
        (word(544), word(552), word(560))


def test_memory_is_bounded():
    """The oldest names are let go past MAX_CODES code objects or
    MAX_KEPT_BYTES of names and tables (a recording's: nothing to re-read)."""
    names = pc.PythonCode(live=False)
    small = PythonCodeInfo("f", "/a.py", 1, pc.LOCATIONS, b"")
    for code in range(pc.MAX_CODES + 1):
        names.add(1, code * 8, small)
    assert names.frame(1, 0, 0).function == "[python code 0x0]"
    assert names.frame(1, 8, 0).function == "f"
    big = PythonCodeInfo("g", "/b.py", 1, pc.LOCATIONS, bytes(1 << 20))
    for code in range(pc.MAX_KEPT_BYTES >> 20):
        names.add(2, code * 8, big)
    assert names.frame(2, 0, 0).function == "[python code 0x0]"
    assert names.frame(2, 8 * ((pc.MAX_KEPT_BYTES >> 20) - 1), 0).function == "g"


def test_a_line_of_code_in_two_processes_is_one_frame():
    """Two processes of one Python program (its code objects at other
    addresses in each): a line of code is one Frame for both, handed out
    again (a sink knows it by identity); another line, or another file's
    function of that name, is a Frame of its own."""
    names = pc.PythonCode(live=False)
    names.add(1, 0x1000, PythonCodeInfo("f", "/a.py", 10, pc.LOCATIONS, b""))
    names.add(2, 0x2000, PythonCodeInfo("f", "/a.py", 10, pc.LOCATIONS, b""))
    names.add(2, 0x3000, PythonCodeInfo("f", "/b.py", 10, pc.LOCATIONS, b""))
    first, second = names.frame(1, 0x1000, 0), names.frame(2, 0x2000, 0)
    assert (first.function, first.file, first.line) == ("f", "/a.py", 10)
    assert second is first
    other = names.frame(2, 0x3000, 0)
    assert (other.file, other.module) == ("/b.py", "b.py") and other is not first


@pytest.mark.parametrize("target", INTERPRETERS[:1] or ["none"], indirect=True)
def test_what_is_no_code_object_is_not_named(target):
    """An address that holds no code object (a bytes object of zeros) or
    that is not mapped: remember() lets the capture go on, frame() gives
    the placeholder."""
    facts, proc = target
    version = tuple(facts["version"])
    names = pc.PythonCode()
    for address in (facts["not_code"], 8):
        names.remember(proc.pid, address, version)
        assert names.frame(proc.pid, address, 0).function == f"[python code {address:#x}]"


@pytest.mark.parametrize("firstlineno", [-230203915, 10**23, 1 << 31])
def test_a_line_no_code_has_is_no_line(firstlineno):
    """A code object freed and reused under a running frame gives garbage
    lines (both seen on a whole-machine profile): not a line, 0."""
    garbage = PythonCodeInfo("f", "/a.py", firstlineno, pc.LOCATIONS, b"")
    names = pc.PythonCode(live=False)
    names.add(1, 8, garbage)
    assert names.frame(1, 8, PYTHON_INDEX_MAX).line == 0
    assert names.frame(1, 8, 3).line == 0


def test_a_real_first_line_is_kept():
    names = pc.PythonCode(live=False)
    names.add(1, 8, PythonCodeInfo("f", "/a.py", 41, pc.LOCATIONS, b""))
    assert names.frame(1, 8, PYTHON_INDEX_MAX).line == 41
