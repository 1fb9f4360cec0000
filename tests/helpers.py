"""Shared test helpers: build the target programs, run ustack, ask gdb,
parse what ustack prints; everything more than one test file uses.

Target programs live in tests/programs/ as sources and are compiled on demand
into a content-addressed cache (/tmp/ustack-test-bin/<hash>/, or
$USTACK_TEST_BIN), so repeated runs and variants cost nothing.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import re
from collections import Counter
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import ustack
from ustack.model import Frame, Mapping, Stack, StackCount, python_frame_parts
from ustack.native import libdw
from ustack.objfile.dwarf_lines import LineTable
from ustack.objfile.elf import ElfImage
from ustack.report.formats import EVENT_FORMATS, ReportContext, stack_report
from ustack.symbols import python as pc

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "tests" / "programs"
CACHE = Path(os.environ.get("USTACK_TEST_BIN", "/tmp/ustack-test-bin"))

# Compiler flag sets. The default keeps frame pointers; O2_NOFP is the case
# only DWARF CFI can unwind.
FP = ("-O0", "-g", "-fno-omit-frame-pointer")
O2_FP = ("-O2", "-g", "-fno-omit-frame-pointer")
O2_NOFP = ("-O2", "-g", "-fomit-frame-pointer")

# Named C variants, for parametrizing: name -> keyword arguments of build().
VARIANTS = {
    "fp": dict(flags=FP),
    "fp-nopie": dict(flags=FP, pie=False),
    "o2-fp": dict(flags=O2_FP),
    "o2-nofp": dict(flags=O2_NOFP),
}

# Extra link arguments some programs need.
_LIBS = {"threads": ["-pthread"], "parked": ["-pthread"], "dlopen_main": ["-ldl"],
         "dlopen_deep": ["-ldl"],
         "usdt_dl": ["-ldl"]}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (needed to build/run test programs)")
    return path


def _cached(key: str, filename: str) -> tuple[Path, Path]:
    """(final output path, temporary path in the same directory). Each
    checkout, and each parallel worker of a run (pytest-xdist), gets files
    of its own: a uprobe is set on a file (inode), and a system-wide one
    from another suite or worker would fire in this one's processes (gdb's
    breakpoint there never stops, samples land in [uprobes])."""
    key = f"{PROGRAMS}\0{os.environ.get('PYTEST_XDIST_WORKER', '')}\0{key}"
    out_dir = CACHE / hashlib.sha256(key.encode()).hexdigest()[:16]
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / filename, out_dir / f".{filename}.{os.getpid()}.tmp"


def _run_build(cmd: list[str], tmp: Path, out: Path, **kw) -> Path:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{res.stderr}")
    tmp.replace(out)  # atomic: concurrent sessions never see a half-written file
    return out


def build(name: str, flags=FP, kind: str = "exe", pie: bool = True) -> Path:
    """Compile tests/programs/<name>.c with gcc and return the output path.

    kind='exe' builds an executable (PIE unless pie=False); kind='shared'
    builds <name>.so with -fPIC -shared. The output is cached by source text,
    flags and kind.
    """
    gcc = _tool("gcc")
    if kind not in ("exe", "shared"):
        raise ValueError(f"kind must be 'exe' or 'shared', not {kind!r}")
    src = PROGRAMS / f"{name}.c"
    args = list(flags)
    if kind == "shared":
        args += ["-fPIC", "-shared"]
        filename = f"{name}.so"
    else:
        args += ["-fPIE", "-pie"] if pie else ["-fno-pie", "-no-pie"]
        filename = name
    args += _LIBS.get(name, [])
    headers = "".join(h.read_text() for h in sorted(PROGRAMS.glob("*.h")))
    key = "\0".join([src.read_text(), headers, gcc, *args])
    out, tmp = _cached(key, filename)
    if out.exists():
        return out
    return _run_build([gcc, *args, "-o", str(tmp), str(src)], tmp, out)


def build_go(name: str = "gochain", strip: bool = False, pie: str = "") -> Path:
    """`go build` tests/programs/<name>/ and return the executable's path.

    strip=True adds -ldflags='-s -w' (no .symtab, no DWARF; .gopclntab
    stays). pie="internal" builds a PIE with Go's own linker, pie="external"
    one linked by gcc (as cgo programs are: .text starts with C start-up
    code, pointers are left to the loader's relocations). Module mode, no
    network, caches under the build cache dir.
    """
    go = _tool("go")
    src = PROGRAMS / name
    args = ["-buildvcs=false"]  # the repo is git without commits: VCS stamping fails
    ldflags = ["-s", "-w"] if strip else []
    if pie:
        args.append("-buildmode=pie")
        ldflags.append(f"-linkmode={pie}")
    if ldflags:
        args.append("-ldflags=" + " ".join(ldflags))
    version = subprocess.run([go, "version"], capture_output=True, text=True).stdout
    sources = "".join(p.read_text() for p in sorted(src.iterdir()) if p.is_file())
    # go embeds the source directory's path in the binary's file names
    out, tmp = _cached("\0".join([sources, version, str(src), *args]), name)
    if out.exists():
        return out
    env = dict(os.environ, GO111MODULE="on", GOFLAGS="-mod=mod", GOPROXY="off",
               GOCACHE=str(CACHE / "go-cache"), GOPATH=str(CACHE / "go-path"))
    return _run_build([go, "build", *args, "-o", str(tmp), "."], tmp, out,
                      cwd=src, env=env)


def ustack_env() -> dict[str, str]:
    """The environment for `python -m ustack`: the repo's src/ first on the path."""
    path = os.environ.get("PYTHONPATH")
    src = str(REPO / "src")
    return dict(os.environ, PYTHONPATH=f"{src}{os.pathsep}{path}" if path else src)


# The pids of the ustack processes the running test started (reset by
# conftest.py before each test): the leak check judges the probes and
# tracefs instances of these runs only (they are named ustack_<pid>), so
# another session's killed run cannot fail this test.
USTACK_PIDS: list[int] = []

USTACK = (sys.executable, "-m", "ustack")


def popen_ustack(*args, cmd=USTACK, **kw) -> subprocess.Popen:
    """Start `python -m ustack ARGS…` (or CMD ARGS…, a command that runs
    ustack) with the repo's src/ first on the path, and record its pid for
    the leak check. Every ustack process a test starts goes through here."""
    proc = subprocess.Popen([*map(str, cmd), *map(str, args)],
                            env=kw.pop("env", None) or ustack_env(), **kw)
    USTACK_PIDS.append(proc.pid)
    return proc


def run_ustack(*args, timeout: float = 60, cmd=USTACK, text: bool = True,
               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
               **kw) -> subprocess.CompletedProcess:
    """Run `python -m ustack ARGS…` and wait; stdout/stderr are captured
    (text unless text=False; pass stdout=FILE to send it elsewhere).

    On timeout the ustack process is killed (SIGKILL) and TimeoutExpired is
    raised; the leak check in conftest.py then reports any target left behind.
    """
    proc = popen_ustack(*args, cmd=cmd, text=text, stdout=stdout, stderr=stderr, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def guardians(pid: int) -> list[int]:
    """The guardian of ustack run `pid`: its child that is a fork of it
    (the same command line), not its -c command."""
    me = Path(f"/proc/{pid}/cmdline").read_bytes()
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:  # a thread of the run may end while its siblings are listed
            kids += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            pass
    found = []
    for kid in kids:
        try:
            if Path(f"/proc/{kid}/cmdline").read_bytes() == me:
                found.append(kid)
        except OSError:
            pass
    return found


def kill_run_and_guardian(proc: subprocess.Popen) -> None:
    """SIGKILL a ustack run and its guardian (as the OOM killer or a kill
    of both might): what they made is left for the next run to remove."""
    for pid in guardians(proc.pid):
        os.kill(pid, signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)


# Starts ustack from a small process and reports its maxrss: a process
# forked from pytest itself carries pytest's peak into its own maxrss at
# exec (the kernel keeps the larger), so wait4 on it would measure pytest.
_PEAK_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
with open(sys.argv[1], "w") as f:
    f.write(f"{pid}\\n")
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "a") as f:
    f.write(f"{usage.ru_maxrss}\\n")
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def run_ustack_peak(*args, timeout: float = 120, discard_stdout: bool = False,
                    **kw) -> tuple:
    """Run `python -m ustack ARGS…` like run_ustack; also return its peak
    resident memory in MB (the kernel's own maxrss of that process, taken
    by wait4 as it is reaped: no sampling, nothing missed). With
    `discard_stdout` its output goes to /dev/null (stdout is then "")."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "peak")
        launcher = (sys.executable, "-c", _PEAK_LAUNCHER, report, *USTACK)
        res = run_ustack(*args, timeout=timeout, cmd=launcher,
                         stdout=subprocess.DEVNULL if discard_stdout else subprocess.PIPE,
                         **kw)
        lines = open(report).read().split()
    USTACK_PIDS.append(int(lines[0]))            # the leak check judges ustack's own pid
    if res.stdout is None:
        res.stdout = ""
    return res, int(lines[1]) / 1024


def catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has its SIGTERM handler set (a builder child
    is ready to leave as Python does)."""
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        return False
    caught = int(status.split("SigCgt:")[1].split()[0], 16)
    return bool(caught & 1 << (signal.SIGTERM - 1))


def wait_until(condition, timeout: float = 10, what: str = "the condition") -> None:
    """Poll `condition()` until it is true; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout} s")
        time.sleep(0.02)


# "#1  0x000055555555518d in c (n=1) at chain.c:20" or "#0  d () at chain.c:9"
_GDB_FRAME = re.compile(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(.+?) \(")


def gdb_backtrace(prog, args=(), breakpoint: str = "d", timeout: float = 60) -> list[str]:
    """Function names, innermost first, that gdb shows at the first hit of
    `breakpoint` (empty if it is never hit). gdb unwinds with DWARF CFI, so
    this is the oracle for complete stacks. Go names look like main.(*T).c.
    """
    gdb = _tool("gdb")
    cmd = [gdb, "-batch", "-nx",
           "-iex", "set debuginfod enabled off",
           "-ex", "set breakpoint pending on",  # plugin functions exist only after dlopen
           "-ex", f"break {breakpoint}", "-ex", "run", "-ex", "bt",
           "--args", str(prog), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         stdin=subprocess.DEVNULL)
    return [m.group(1) for line in res.stdout.splitlines()
            if (m := _GDB_FRAME.match(line))]


def java_tool(name: str) -> str:
    """The JDK tool `name` (java, javac, jcmd); skips the test without it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: no Java program to profile")
    return path


def compiled_java_chain(directory, name: str = "Chain") -> Path:
    """tests/programs/java/Chain.java (or NAME.java) compiled into
    `directory` (its classpath)."""
    subprocess.run([java_tool("javac"), "-d", str(directory),
                    str(PROGRAMS / "java" / f"{name}.java")], check=True)
    return directory


def build_go_source(directory, source: str, name: str = "prog",
                    ldflags: str = "") -> str:
    """Build a one-file Go program (module example.com/t) in `directory`;
    skips the test when go is missing. Returns the binary's path."""
    if shutil.which("go") is None:
        pytest.skip("go is not installed")
    d = Path(directory)
    (d / "main.go").write_text(source)
    (d / "go.mod").write_text("module example.com/t\n\ngo 1.19\n")
    flags = [f"-ldflags={ldflags}"] if ldflags else []
    subprocess.run(["go", "build", "-buildvcs=false", *flags, "-o", name, "."],
                   cwd=d, check=True, capture_output=True,
                   env={**os.environ, "CGO_ENABLED": "0"})
    return str(d / name)


_A2L_LOC = re.compile(r"^(.*?):(\d+|\?)(?::\d+)?(?: \(discriminator \d+\))?$")


def addr2line_chains(tool: str, binary, addrs) -> dict:
    """{addr: [(function, file, line), …]} as `TOOL -a -i -f -e BINARY`
    lists them (eu-addr2line or binutils addr2line): innermost inlined call
    first, the real function last at the line of the call it inlined.
    Locations the tool does not know (??:0) are left out."""
    path = _tool(tool)
    out = subprocess.run([path, "-a", "-i", "-f", "-e", str(binary),
                          *(hex(a) for a in addrs)],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    chains: dict = {}
    current = None
    i = 0
    while i < len(out):
        if re.fullmatch(r"0x[0-9a-f]+", out[i]):
            current = chains.setdefault(int(out[i], 16), [])
            i += 1
            continue
        function = out[i].split(" inlined at ")[0]
        m = _A2L_LOC.match(out[i + 1])
        i += 2
        if m and m.group(1) != "??" and m.group(2) not in ("0", "?"):
            current.append((function, m.group(1), int(m.group(2))))
    return chains


# -- Arguments by name ---------------------------------------------------------

N = 3                                  # calls of each function per run


MIX = "i len buf c neg flag ok ch big last"


def no_aslr(prog) -> str:
    """The command line that runs prog as gdb does: without address
    randomization, so its pointers are gdb's."""
    if shutil.which("setarch") is None:
        pytest.skip("setarch is not installed (needed to compare pointers with gdb)")
    return f"setarch x86_64 -R {prog} 0 {N}"


def label_values(label: str) -> dict:
    """'uprobe:/x:f a=1 s="x y" c='A'' -> {'a': '1', 's': '"x y"', 'c': "'A'"}."""
    return dict(re.findall(r' (\w+)=("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\S+)', label))


# -- C++ targets and their stacks as gdb sees them -----------------------------

STACK_LIMIT = 64 << 10          # bytes of stack taken, like a large --stack-size


GDB_REGS = {"rax": "ax", "rbx": "bx", "rcx": "cx", "rdx": "dx", "rsi": "si",
            "rdi": "di", "rbp": "bp", "rsp": "sp", "rip": "ip", "eflags": "flags",
            **{f"r{i}": f"r{i}" for i in range(8, 16)}}


# Runs inside gdb: stop at BREAK, write registers, stack, maps and gdb's
# frames (pc, name) as JSON. A signal frame's name is None. Frames gdb
# infers from debug info but that have no stack frame of their own are left
# out: inlined calls and tail calls (qsort jumps to qsort_r).
_GDB_SCRIPT = """
import gdb, json
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set backtrace past-main on")
gdb.execute("handle SIGALRM nostop noprint pass")
# BREAK may name several stops, ";"-separated: symbols that exist only once
# the program runs (the vDSO's) are set at the previous stop.
for i, where in enumerate(BREAK.split(";")):
    gdb.execute("break " + where)
    gdb.execute("run" if i == 0 else "continue")
inf = gdb.selected_inferior()
regs = {n: int(gdb.parse_and_eval("$" + n)) & (2**64 - 1) for n in REGS}
maps = open("/proc/%d/maps" % inf.pid).read()
sp = regs["rsp"]
end = sp
for line in maps.splitlines():
    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
    if lo <= sp < hi:
        end = min(hi, sp + LIMIT)
stack = inf.read_memory(sp, end - sp).tobytes()
frames = []
f = gdb.newest_frame()
while f is not None and len(frames) < 64:
    if f.type() not in (gdb.INLINE_FRAME, gdb.TAILCALL_FRAME):
        frames.append([f.pc(), f.name()])
    f = f.older()
json.dump({"pid": inf.pid, "regs": regs, "maps": maps, "stack": stack.hex(),
           "frames": frames}, open(OUT, "w"))
gdb.execute("kill")
"""


class Capture:
    """One stop of a program under gdb."""

    def __init__(self, data: dict, prog: Path):
        self.prog = prog
        self.pid = data["pid"]
        self.regs = {GDB_REGS[k]: v for k, v in data["regs"].items()}
        self.stack = bytes.fromhex(data["stack"])
        self.maps = parse_maps(data["maps"])
        self.gdb_pcs = [pc for pc, _ in data["frames"]]
        self.gdb_names = [name for _, name in data["frames"]]

    def find(self, pid: int, addr: int):        # the symbolizer's interface
        return next((m for m in self.maps if m.start <= addr < m.end), None)

    def find_mapping(self, addr: int):
        return self.find(self.pid, addr)

    def open_instead(self, path: Path, other: Path) -> None:
        """Let the unwinder read `other` where the process mapped `path`
        (Mapping.host_path), e.g. a stripped copy with the same code."""
        self.maps = [Mapping(m.start, m.end, m.pgoff, m.path, str(other))
                     if m.path == str(path) else m for m in self.maps]


def parse_maps(text: str) -> list:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if "x" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append(Mapping(lo, hi, int(parts[2], 16), parts[5].strip() if len(parts) == 6 else ""))
    return out


def gdb_capture(prog: Path, args, brk: str, tmp_path: Path) -> Capture:
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.skip("gdb is not installed (the oracle of these tests)")
    out = tmp_path / "capture.json"
    script = tmp_path / "capture.py"
    script.write_text(f"BREAK = {brk!r}\nOUT = {str(out)!r}\nLIMIT = {STACK_LIMIT}\n"
                      f"REGS = {list(GDB_REGS)!r}\n" + _GDB_SCRIPT)
    res = subprocess.run([gdb, "-batch", "-nx", "-iex", "set debuginfod enabled off",
                          "-x", str(script), "--args", str(prog), *map(str, args)],
                         capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL)
    if not out.exists():
        pytest.fail(f"gdb did not stop at {brk}:\n{res.stdout}\n{res.stderr}")
    return Capture(json.loads(out.read_text()), prog)


def build_cxx(name: str, flags) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed (needed for the C++ test program)")
    src = PROGRAMS / f"{name}.cpp"
    args = [*flags, "-fPIE", "-pie"]
    out, tmp = _cached("\0".join([src.read_text(), gxx, *args]), name)
    if out.exists():
        return out
    return _run_build([gxx, *args, "-o", str(tmp), str(src)], tmp, out)


# -- dwz-compressed debug files ------------------------------------------------

def split_and_dwz(tmp_path, programs, altlink):
    """Each program's debug info split into NAME.debug, the pair compressed
    with `dwz -m` into one alt file (linked as `altlink`: a name relative to
    the debug files' directory, or absolute), then each program stripped with
    a .gnu_debuglink to its compressed debug file. Returns
    {name: (original, stripped, debug file)}."""
    for tool in ("dwz", "objcopy"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install {tool})")
    out = {}
    for prog in programs:
        name = prog.name
        debug = tmp_path / f"{name}.debug"
        subprocess.run(["objcopy", "--only-keep-debug", str(prog), str(debug)], check=True)
        out[name] = (prog, tmp_path / name, debug)
    subprocess.run(["dwz", "-m", str(tmp_path / "common.dwz"), "-M", altlink,
                    *(str(d) for _p, _s, d in out.values())], check=True, cwd=tmp_path)
    for prog, stripped, debug in out.values():
        # the link's CRC is of the compressed file: add it after dwz
        subprocess.run(["objcopy", "--strip-debug", f"--add-gnu-debuglink={debug}",
                        str(prog), str(stripped)], check=True)
    return out


def programs():
    return [build("inline", flags=O2_FP), build("chain", flags=O2_FP)]


# -- Traced runs: start and stop ustack and targets, parse what it prints ------

TRACEFS = Path("/sys/kernel/tracing")


CHAIN = ["d", "c", "b", "a", "main"]


# "chain 21832/21832 [000] 821.150252: uprobe:/path/chain:d"
_HEADER = re.compile(r"^(?P<comm>.+?) (?P<pid>\d+)/(?P<tid>\d+)"
                     r"(?: \[ns (?P<nspid>\d+)/(?P<nstid>\d+)\])? \[(?P<cpu>\d+)\] "
                     r"(?P<secs>\d+)\.(?P<usecs>\d{6}): (?P<label>.+)$")


# " 0x000055abdf073221 : c+0x2a/0x47 [chain]" or " 0x… : [unknown] [libc.so.6]";
# code no symbol names: " 0x… : fn@0x11e0+0x16 [chain]" (its CFI's start) or
# " 0x… : 0x11f6 [chain]" (its address in the object)
_TRACE_FRAME = re.compile(r"^ 0x(?P<addr>[0-9a-f]{16}) : (?:(?P<func>.+?)\+0x(?P<off>[0-9a-f]+)"
                          r"/0x(?P<size>[0-9a-f]+)|(?P<unknown>\[unknown\])"
                          r"|(?P<unnamed>fn@0x[0-9a-f]+|0x[0-9a-f]+)(?:\+0x(?P<uoff>[0-9a-f]+))?)"
                          r"(?: \[(?P<module>[^\]]*)\])?$")
# an interpreter's or a runtime-named JIT frame, which has no address of
# its own: "<19 spaces>: leaf [python] app.py:7", "... : Mix.leaf [java] Mix.java:9"
_TRACE_PYTHON = re.compile(r"^ {20}: (?P<func>.+?) \[(?P<kind>python|php|perl|ruby|js|java)\]"
                           r"(?: (?P<file>.+):(?P<line>\d+))?$")


# "  func [module]" / "  func+0xOFF/0xSIZE [module]" / "  [unknown]"
_COUNT_FRAME = re.compile(r"^  (?P<func>\S.*?)(?: \[(?P<module>[^\]]*)\])?$")


_COUNT_PID = re.compile(r"^    (?P<comm>.+) \[(?P<pid>\d+)(?:/(?P<nspid>\d+))?\]"
                        r"(?: tid (?P<tid>\d+)(?:/\d+)?)?$")


# a count, then what it sums with --weight: `600 bytes (count)`, `-50 (sum of delta)`
_COUNT_N = re.compile(r"^    (?P<n>-?\d+)(?: (?P<unit>[a-z].*|\(.*\)))?$")


def parse_trace(out: str) -> list[dict]:
    """`ustack trace` stdout -> records {comm, pid, tid, cpu, time, label,
    frames: [{addr, func, off, size, module}], notes: [str]}; every line
    must parse (notes are ` (…)` lines after the frames; a Python frame has
    module "python", addr 0, and its file and line)."""
    records, cur = [], None
    for line in out.splitlines():
        if not line:
            cur = None
            continue
        if cur is None:
            m = _HEADER.match(line)
            assert m, f"bad trace header line: {line!r}"
            cur = dict(comm=m["comm"], pid=int(m["pid"]), tid=int(m["tid"]),
                       nspid=int(m["nspid"] or m["pid"]),
                       cpu=int(m["cpu"]), label=m["label"],
                       time=int(m["secs"]) + int(m["usecs"]) / 1e6, frames=[],
                       notes=[])
            records.append(cur)
            continue
        if line.startswith(" (") and line.endswith(")"):
            cur["notes"].append(line[2:-1])
            continue
        assert not cur["notes"], f"frame line after a note: {line!r}"
        py = _TRACE_PYTHON.match(line)
        if py:
            cur["frames"].append(dict(addr=0, module=py["kind"], func=py["func"], off=None,
                                      size=None, file=py["file"],
                                      line=int(py["line"]) if py["line"] else None))
            continue
        m = _TRACE_FRAME.match(line)
        assert m, f"bad trace frame line: {line!r}"
        cur["frames"].append(dict(
            addr=int(m["addr"], 16), module=m["module"],
            func=m["unknown"] or m["unnamed"] or m["func"],
            off=(int(m["off"], 16) if m["off"] else
                 int(m["uoff"], 16) if m["uoff"] else None),
            size=int(m["size"], 16) if m["size"] else None))
    return records


def events_lost(stderr: str) -> int:
    """The events a run says its full buffer lost ("Lost N events: …"): a
    count exact to the event (tests/test_lost_accounting.py), so a test
    that counts hits on a loaded machine counts delivered + lost."""
    return sum(int(m.group(1)) for m in re.finditer(r"^Lost (\d+) events", stderr, re.M))


def parse_counts(out: str) -> list[dict]:
    """`ustack count/profile` text stdout -> [{frames: [(func, module)],
    count, comm, pid, event}] in output order (event: the header line a
    run of several events puts above each event's stacks, else None);
    every line must parse."""
    stacks, frames, who, event = [], [], None, None
    for line in out.splitlines():
        if not line:
            assert not frames, f"stack without a count before a blank line: {frames}"
            continue
        if not line.startswith(" "):
            assert not frames, f"an event's header inside a stack: {line!r}"
            event = line
        elif (m := _COUNT_N.match(line)):
            stacks.append(dict(frames=frames, count=int(m["n"]), unit=m["unit"], event=event,
                               comm=who and who[0], pid=who and who[1],
                               nspid=who and who[2], tid=who and who[3]))
            frames, who = [], None
        elif (m := _COUNT_PID.match(line)):
            who = (m["comm"], int(m["pid"]), int(m["nspid"] or m["pid"]),
                   int(m["tid"] or 0))
        else:
            m = _COUNT_FRAME.match(line)
            assert m, f"bad count line: {line!r}"
            frames.append((m["func"], m["module"]))
    assert not frames, f"trailing frames without a count: {frames}"
    return stacks


def parse_folded(out: str) -> list[tuple[list[str], int]]:
    """`-f folded` -> [(['comm', outermost, …, innermost], count)]."""
    rows = []
    for line in out.splitlines():
        stack, _, n = line.rpartition(" ")
        assert stack and n.isdigit(), f"bad folded line: {line!r}"
        rows.append((stack.split(";"), int(n)))
    return rows


_UNNAMED = re.compile(r"^(?:\[unknown\]|fn@0x[0-9a-f]+|0x[0-9a-f]+)$")


def unnamed(name: str) -> bool:
    """Whether a parsed frame's function is no name: `[unknown]`, or code
    of a file that no symbol names (`fn@0x11e0`, `0x11f6`)."""
    return bool(_UNNAMED.match(name))


def funcs(frames) -> list[str]:
    """Function names of parsed frames (trace dicts or count tuples)."""
    return [f["func"] if isinstance(f, dict) else f[0] for f in frames]


def program_frames(names, modules, module="chain", last="main") -> list[str]:
    """The frames of `module` from the innermost one through `last` (what
    lies beyond main, e.g. _start, is not the program's call chain)."""
    ours = [f for f, m in zip(names, modules) if m == module]
    return ours[:ours.index(last) + 1] if last in ours else ours


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """Assert a ustack run succeeded the way a user expects: status 0, a
    `Tracing …` status line on stderr, and no traceback anywhere."""
    assert res.returncode == 0, f"exit {res.returncode}\nstderr: {res.stderr}"
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr.splitlines()[:1] and res.stderr.splitlines()[0].startswith("Tracing "), \
        f"no 'Tracing' status line on stderr: {res.stderr!r}"
    assert "Tracing " not in res.stdout
    return res


def traced_pid(stderr: str) -> int:
    """The PID of a -c command, from the status line `… (PID 123) …`."""
    m = re.search(r"\(PID (\d+)\)", stderr)
    assert m, f"no (PID N) in the status line: {stderr!r}"
    return int(m.group(1))


def fail_one_line(res: subprocess.CompletedProcess) -> str:
    """Assert a ustack error: exit 1, exactly one `ustack: …` line on stderr,
    no traceback, nothing on stdout; return the message."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 1, f"exit {res.returncode}, stderr: {res.stderr!r}"
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ustack: "), \
        f"want one 'ustack: …' line, got {res.stderr!r}"
    assert res.stdout == ""
    return lines[0]


def nm_symbols(path) -> dict[str, tuple[int, int]]:
    """name -> (address, size) of defined text symbols, from `nm -S`."""
    out = subprocess.run(["nm", "-S", str(path)], capture_output=True, text=True,
                         check=True).stdout
    syms = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            syms[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return syms


def disassembly(path) -> dict[str, list[tuple[int, str]]]:
    """function -> [(address, instruction text)] from `objdump -d`."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                         capture_output=True, text=True, check=True).stdout
    funcs_, cur = {}, None
    for line in out.splitlines():
        if (m := re.match(r"^([0-9a-f]+) <(.+)>:$", line)):
            cur = funcs_.setdefault(m.group(2), [])
        elif cur is not None and (m := re.match(r"^\s+([0-9a-f]+):\s+(\S.*)$", line)):
            cur.append((int(m.group(1), 16), m.group(2)))
        elif not line.strip():
            cur = None
    return funcs_


def return_offset(dis, caller: str, callee: str) -> int:
    """Offset in `caller` of the instruction after its one call to `callee`:
    the return address a correct unwind shows for `caller`'s frame."""
    insns = dis[caller]
    calls = [i for i, (_, text) in enumerate(insns)
             if re.match(rf"call\w*\s+[0-9a-f]+ <{re.escape(callee)}>$", text)]
    assert len(calls) == 1, f"{caller} should call {callee} once: {insns}"
    return insns[calls[0] + 1][0] - insns[0][0]


def load_segments(path) -> list[tuple[int, int, int]]:
    """[(file offset, vaddr, filesz)] of the PT_LOAD headers (`readelf -lW`)."""
    out = subprocess.run(["readelf", "-lW", str(path)], capture_output=True,
                         text=True, check=True).stdout
    segs = []
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["LOAD"]:
            segs.append((int(parts[1], 16), int(parts[2], 16), int(parts[4], 16)))
    return segs


def start_ustack(*args, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return popen_ustack(*args, stdout=stdout, stderr=subprocess.PIPE, text=True)


def wait_tracing(proc: subprocess.Popen, timeout: float = 20) -> str:
    """Block until ustack prints its `Tracing …` line (probes armed)."""
    ready, _, _ = select.select([proc.stderr], [], [], timeout)
    if not ready:
        proc.kill()
        proc.wait()
        pytest.fail(f"ustack printed nothing on stderr within {timeout} s")
    line = proc.stderr.readline()
    if not line.startswith("Tracing "):
        proc.kill()
        rest = proc.communicate()[1]
        pytest.fail(f"ustack did not start tracing: {line}{rest}")
    return line


# `perf record` options of the oracle: its own event asks for the build-id in
# each MMAP2 record. Without it, on this kernel, perf's MMAP2 records came
# flagged as carrying a build-id that was their inode fields, and perf
# script 6.1 aborted (util/build-id.c assertion, "stack smashing detected"):
# seen while other runs on the machine had events open that ask for one.
PERF_BUILD_IDS = ("--buildid-mmap",)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system, all threads) process PID has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_for_cpu(pid: int, *args, seconds: float = 1.0, timeout: float = 300
                ) -> subprocess.CompletedProcess:
    """Run `ustack ARGS… -p PID` until the busy target PID has used SECONDS
    of CPU time since ustack began tracing, then end it as Ctrl-C does: a
    profile at F Hz holds about F * SECONDS samples of it however loaded
    the machine is (a run of fixed length holds what the scheduler gave).
    stdout goes to a file, so a long output never blocks the run."""
    with tempfile.TemporaryFile("w+") as stdout:
        us = start_ustack(*args, "-p", pid, stdout=stdout)
        try:
            header = wait_tracing(us)
            err = end_after_cpu(us, pid, seconds, timeout)
        finally:
            stop(us)
        stdout.seek(0)
        return subprocess.CompletedProcess(us.args, us.returncode, stdout.read(), header + err)


def end_after_cpu(us: subprocess.Popen, pid: int, seconds: float = 1.0,
                  timeout: float = 300) -> str:
    """End the tracing run `us` (SIGINT, as Ctrl-C) once process PID has
    used SECONDS more of CPU time, and return the rest of its stderr."""
    start = cpu_seconds(pid)
    wait_until(lambda: cpu_seconds(pid) - start >= seconds, timeout,
               f"{seconds} s of CPU time used by PID {pid}")
    us.send_signal(signal.SIGINT)
    return finish(us)[1]


def spawn(*argv, stdin=None) -> subprocess.Popen:
    """Start a target the way a shell does: a thread reaps it the moment it
    exits (an unreaped zombie still has /proc/PID; see
    test_pid_target_exit_seen_while_unreaped for that case)."""
    proc = subprocess.Popen([str(a) for a in argv], stdin=stdin)
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc


def release(target: subprocess.Popen) -> None:
    """Let a target that waits for a line on stdin (the programs' "-"
    argument, a shell's `read`) go on."""
    target.stdin.write(b"go\n")
    target.stdin.close()


def run_attached(target: subprocess.Popen, *args, timeout: float = 30
                 ) -> subprocess.CompletedProcess:
    """Run `ustack ARGS… -p TARGET` on a target that waits for a line on
    stdin: the target is released only once ustack says it is tracing (its
    probes are live), so no call under test can happen before."""
    us = start_ustack(*args, "-p", target.pid, stdout=subprocess.PIPE)
    try:
        header = wait_tracing(us)
        release(target)
        out, err = finish(us, timeout=timeout)
    finally:
        stop(us)
    return subprocess.CompletedProcess(us.args, us.returncode, out, header + err)


def run_attached_beside(mine: subprocess.Popen, other: subprocess.Popen, *args
                        ) -> subprocess.CompletedProcess:
    """`ustack ARGS… -p MINE` while OTHER runs the same binary: both wait
    for a line on stdin; OTHER is released and ends first, then MINE, and
    the run ends with MINE. Judges that -p keeps to its process."""
    try:
        us = start_ustack(*args, "-p", mine.pid, stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us)
            release(other)
            assert other.wait(timeout=30) == 0
            release(mine)
            assert mine.wait(timeout=30) == 0
            out, err = finish(us)        # the run ends when its process has exited
        finally:
            stop(us)
    finally:
        for proc in (mine, other):
            stop(proc)
    return subprocess.CompletedProcess(us.args, us.returncode, out, header + err)


def uprobe_hits(path) -> int:
    """How often the uprobes on the file PATH have fired (tracefs
    uprobe_profile: "PATH EVENT HITS"). On a private copy of a program
    only this test's runs count."""
    return sum(int(f[-1]) for line in (TRACEFS / "uprobe_profile").read_text().splitlines()
               if (f := line.split()) and f[0] == str(path))


def finish(proc: subprocess.Popen, timeout: float = 30) -> tuple[str, str]:
    """communicate() with a ustack run; if it hangs, stop it with SIGINT (so
    it still removes its probes) and fail."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        pytest.fail(f"ustack did not exit within {timeout} s")


def stop(proc: subprocess.Popen) -> None:
    """Kill a process this test started, if it still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def ustack_lines(pid: int) -> list[str]:
    """Probe definitions of the ustack run with this pid (group ustack_<pid>)."""
    return [l for l in (TRACEFS / "uprobe_events").read_text().splitlines()
            if re.match(rf"^[pr]:ustack_{pid}/", l)]


def private_copy(prog: Path, tmp_path: Path) -> Path:
    """A copy with its own inode: system-wide probes on it see only our runs,
    not other sessions running the shared cached binary."""
    dst = tmp_path / prog.name
    shutil.copy2(prog, dst)
    return dst


# -- DWARF runs compared with perf ---------------------------------------------

RECURSE_FLAGS = (*O2_NOFP, "-fno-optimize-sibling-calls")


def truncation_note(size: int) -> str:
    """The note ustack prints when its stack copy ends before the stack does
    (written out here: the text is part of the interface)."""
    return (f"stack copy too small ({size} bytes): the stack was cut short; "
            "raise --stack-size")


_PERF_FRAME = re.compile(r"^\s+([0-9a-f]+) (.+?) \((.+)\)$")


def perf_script_samples(text: str) -> list[list[tuple[str, str]]]:
    """`perf script` callchains -> [[(symbol+0xoff or [unknown], dso path)]]."""
    samples, cur = [], None
    for line in text.splitlines():
        if not line.strip():
            cur = None
        elif not line[0].isspace():
            cur = []
            samples.append(cur)
        elif cur is not None and (m := _PERF_FRAME.match(line)):
            cur.append((m.group(2), m.group(3)))
    return samples


# -- Targets -------------------------------------------------------------------

PLUGIN_CHAIN = [("plugin_leaf", "plugin.so"), ("plugin_entry", "plugin.so"),
                ("run_plugin", "dlopen_main"), ("main", "dlopen_main")]


# -- ELF files: readelf, fake mappings -----------------------------------------

def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def readelf_loads(path):
    """[(offset, vaddr, filesz, memsz, flags)] of PT_LOAD headers."""
    out = []
    for line in run("readelf", "-lW", path).splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            out.append((int(f[1], 16), int(f[2], 16), int(f[4], 16), int(f[5], 16),
                        " ".join(f[6:-1])))
    return out


class FakeMaps:
    def __init__(self, by_pid):
        self.by_pid = by_pid

    def find(self, pid, addr):
        for m in self.by_pid.get(pid, ()):
            if m.contains(addr):
                return m
        return None


def text_mapping(path, base, page=0x1000):
    """The executable mapping of `path` loaded at `base`, as in /proc/PID/maps."""
    (off, vaddr, filesz, _m, _f) = [l for l in readelf_loads(path) if "E" in l[4]][0]
    start = base + (vaddr & ~(page - 1))
    end = (base + vaddr + filesz + page - 1) & ~(page - 1)
    return Mapping(start, end, off & ~(page - 1), path)


# -- Flame graph SVGs ----------------------------------------------------------

SVG = "{http://www.w3.org/2000/svg}"


def render(report, counts, before=()) -> str:
    for sc in before:
        report.add_before(sc)
    for sc in counts:
        report.add(sc)
    out = io.StringIO()
    report.finish(out)
    return out.getvalue()


def svg_frames(text: str) -> list:
    """[(title, rect attributes, label)] of each frame of an SVG."""
    root = ET.fromstring(text)                       # valid XML, or this raises
    assert root.tag == f"{SVG}svg"
    out = []
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "frame":
            continue
        label = g.find(f"{SVG}text")
        out.append((g.find(f"{SVG}title").text, g.find(f"{SVG}rect").attrib,
                    label.text if label is not None else ""))
    return out


# -- Flame graph pages in a browser --------------------------------------------

def counted(*outer_first, count=1, module="prog") -> StackCount:
    frames = tuple(Frame(addr=0x1000, module=module, function=f) for f in reversed(outer_first))
    return StackCount("prog", 7, Stack(frames), count)


def write(report, path, counts, before=()):
    for sc in before:
        report.add_before(sc)
    for sc in counts:
        report.add(sc)
    with open(path, "w") as out:
        report.finish(out)
    return path


def open_page(driver, path):
    driver.get(f"file://{path}")
    # the page's script runs before load ends; a broken script leaves no view
    assert driver.execute_script("return typeof window.flamegraph") == "object", \
        driver.get_log("browser")


def frames(driver) -> list:
    return driver.execute_script("return window.flamegraph.frames()")


def drawn(driver, name: str) -> list:
    """The drawn frames named `name` (picked in the page: a big graph draws
    ~100,000 frames, slow to carry over the driver's wire)."""
    return driver.execute_script(
        "return window.flamegraph.frames().filter(f => f.name === arguments[0])", name)


def drawn_count(driver) -> int:
    return driver.execute_script("return window.flamegraph.frames().length")


def one(driver, name: str) -> dict:
    found = drawn(driver, name)
    assert len(found) == 1, (name, found)
    return found[0]


def point_at(driver, frame, click: bool = False):
    """Move the mouse over the middle of a drawn frame (and click), as a
    person does: the frame scrolled into view first, then the pointer moved
    to its place in the window."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    left, top = driver.execute_script("""
        const canvas = document.getElementById('flamegraph');
        const y = canvas.getBoundingClientRect().top + arguments[0];
        window.scrollBy(0, y - window.innerHeight / 2);
        const r = canvas.getBoundingClientRect();
        return [r.left, r.top];""", frame["y"])
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(int(left + frame["x"] + frame["width"] / 2),
                                            int(top + frame["y"] + frame["height"] / 2))
    if click:
        actions.pointer_action.click()
    actions.perform()


def element(driver, id_: str):
    from selenium.webdriver.common.by import By
    return driver.find_element(By.ID, id_)


# -- pprof profiles read back with go tool pprof -------------------------------

def run_counts(command: str, events: list, cmdline: str, **options) -> tuple:
    """(StackCounts, event labels) of a run through the Python API."""
    opts = ustack.Options(command=command, events=events, cmdline=cmdline, **options)
    with ustack.Session(opts) as run:
        counted = run.counts()
        assert run.capture.losses().lost == 0
    return counted, list(run.labels)


def trace_report(name: str, events: list, cmdline: str, **options) -> tuple:
    """(the text `trace -f name` writes, the finished Session): a run's
    events through the events interface as trace drives it."""
    opts = ustack.Options(command="trace", events=events, cmdline=cmdline, **options)
    out = io.StringIO()
    with ustack.Session(opts) as run:
        report = EVENT_FORMATS[name](out, run.labels)
        for event in run.events():
            report.add(event.sample, event.stack, lambda pid, tid, time_ns, c=event.comm: c)
        report.flush()
    return out.getvalue(), run


def write_report(name: str, counted: list, path: Path, context: ReportContext,
                 per_pid: bool = False) -> Path:
    """The file `-f name -o path` writes for these counted stacks."""
    report = stack_report(name, per_pid=per_pid, context=context)
    for sc in counted:
        report.add(sc)
    binary = getattr(report, "binary", False)
    with open(path, "wb" if binary else "w", encoding=None if binary else "utf-8") as out:
        report.finish(out)
    return path


def pprof(*args) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed (go tool pprof reads the profile)")
    res = subprocess.run([go, "tool", "pprof", *map(str, args)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return res.stdout


def top(path) -> dict:
    """`go tool pprof -top`: function -> (flat, cum), as printed."""
    rows = {}
    lines = pprof("-top", path).splitlines()
    start = next(i for i, l in enumerate(lines) if l.split()[:2] == ["flat", "flat%"])
    for line in lines[start + 1:]:
        flat, _fp, _sp, cum, _cp, name = line.split(None, 5)
        rows[name] = (flat, cum)
    return rows


def traces(path) -> list:
    """`go tool pprof -traces`: [(value, [frame names, leaf first], labels)]."""
    out = []
    for block in pprof("-traces", path).split("-----------+")[1:]:
        value, frames, labels = None, [], {}
        for line in block.splitlines()[1:]:
            m = re.match(r"^\s+(\w+):\s+(.*)$", line)
            if m and value is None:
                labels[m[1]] = m[2]
                continue
            parts = line.split(None, 1)
            if value is None and len(parts) == 2:
                value, name = parts
                frames.append(name)
            elif parts:
                frames.append(line.strip())
        if value is not None:
            out.append((value, frames, labels))
    return out


_RAW_LOC = re.compile(r"^\s+(\d+): 0x([0-9a-f]+) M=(\d+) ?(?:(.*) s=\d+)?$")


_RAW_LINE = re.compile(r"^\s+(.*) s=\d+$")


_RAW_MAP = re.compile(r"^(\d+): 0x([0-9a-f]+)/0x([0-9a-f]+)/0x([0-9a-f]+) (\S+) ?(\S*)")


def raw(path) -> dict:
    """`go tool pprof -raw`: header lines, samples (value lists with the
    location ids), locations {id: (addr, mapping id, ["func file:line"])},
    mappings {id: (start, limit, offset, file, build-id)}."""
    text = pprof("-raw", path)
    head, rest = text.split("\nSamples:\n", 1)
    samples_text, rest = rest.split("\nLocations\n", 1)
    locs_text, maps_text = rest.split("\nMappings\n", 1)
    samples = []
    for line in samples_text.splitlines()[1:]:
        if ":" in line and re.match(r"^\s+[\d ]+: [\d ]+$", line):
            values, ids = line.split(":")
            samples.append(([int(v) for v in values.split()], [int(i) for i in ids.split()]))
    locations, last = {}, None
    for line in locs_text.splitlines():
        m = _RAW_LOC.match(line)
        if m:
            last = locations[int(m[1])] = (int(m[2], 16), int(m[3]), [m[4]] if m[4] else [])
        elif (m := _RAW_LINE.match(line)) and last is not None:
            last[2].append(m[1])
    mappings = {}
    for line in maps_text.splitlines():
        m = _RAW_MAP.match(line)
        if m:
            mappings[int(m[1])] = (int(m[2], 16), int(m[3], 16), int(m[4], 16), m[5], m[6])
    return dict(head=head, sample_types=samples_text.splitlines()[0].split(),
                samples=samples, locations=locations, mappings=mappings)


# -- speedscope in a browser ---------------------------------------------------

SPEEDSCOPE = REPO / "tests" / ".node" / "node_modules" / "speedscope" / "dist" / "release"


NOT_INSTALLED = ("speedscope's npm package is not installed (.ci/run: npm install "
                 "--prefix tests/.node speedscope@1.25.0)")


def open_in_speedscope(driver, path: Path) -> None:
    """Open a file in speedscope's page through its file input (the
    Browse button): a file:// page may not fetch a #profileURL."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    page = SPEEDSCOPE / "index.html"
    if not page.exists():
        pytest.skip(NOT_INSTALLED)
    driver.get(page.as_uri())
    WebDriverWait(driver, 20).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "input[type=file]"))
    driver.find_element(By.CSS_SELECTOR, "input[type=file]").send_keys(str(path))
    WebDriverWait(driver, 20).until(
        lambda d: d.find_elements(By.XPATH, "//*[text()='Sandwich']"))


def sandwich_rows(driver) -> list:
    """The Sandwich view's table as lines of text: total, self, name."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    driver.find_element(By.XPATH, "//*[text()='Sandwich']").click()
    WebDriverWait(driver, 20).until(
        lambda d: "Symbol Name" in d.find_element(By.TAG_NAME, "body").text)
    text = driver.find_element(By.TAG_NAME, "body").text
    return text.split("Symbol Name", 1)[1].strip().splitlines()


# -- Source lines: addr2line against ustack's own ------------------------------

BASE = 0x555555554000


def require_libdw():
    if not libdw.available():
        pytest.skip("libdw.so.1 is not installed (apt-get install libdw1)")


def instructions(path, functions):
    """Every instruction address of the named functions (objdump -d), the
    alignment padding after them left out."""
    image = ElfImage.open(str(path))
    inside = [(s.address, s.address + s.size) for f in functions for s in image.find(f)]
    out = []
    for line in run("objdump", "-d", "--no-show-raw-insn", str(path)).splitlines():
        if m := re.match(r"^\s+([0-9a-f]+):", line):
            a = int(m.group(1), 16)
            if any(lo <= a < hi for lo, hi in inside):
                out.append(a)
    return out


def ours(path, addrs):
    table = LineTable.for_image(ElfImage.open(str(path)))
    return {a: [(l.function, l.file, l.line) for l in table.locate(a)] for a in addrs}


def call_returns(path, function, callee):
    """Return addresses of the calls to `callee` inside `function`."""
    out, current, prev = [], None, None
    for line in run("objdump", "-d", "--no-show-raw-insn", str(path)).splitlines():
        if m := re.match(r"^[0-9a-f]+ <(.+)>:$", line):
            current = m.group(1)
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m and current == function:
            if prev is not None:
                out.append(int(m.group(1), 16))
                prev = None
            if re.search(rf"call\s+[0-9a-f]+ <{callee}>", m.group(2)):
                prev = m.group(1)
    return out


# -- Python interpreters -------------------------------------------------------

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "python", "code_names.py")


PYENV = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))


def _version(python):
    return tuple(map(int, python.split("/")[4].split(".")[:2]))


INTERPRETERS = [p for p in PYENV if _version(p) in pc.CODE_OFFSETS]


# -- Recorded fixtures ---------------------------------------------------------

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def rebuilt_copy(binary: Path, directory: Path) -> Path:
    """A copy of binary, named as it was recorded, with another build-id."""
    build_id = bytes.fromhex(ElfImage.open(str(binary)).build_id)
    data = binary.read_bytes()
    assert data.count(build_id) == 1
    copy = directory / "chain"
    copy.write_bytes(data.replace(build_id, bytes(b ^ 0xFF for b in build_id)))
    return copy


# --- Python targets (tests/programs/python/frames.py) ----------------------------

PROG = Path(__file__).resolve().parent / "programs" / "python" / "frames.py"
PY_CHAIN = ["<module>", "main", "outer", "middle", "leaf"]
# below leaf, per mode: the Python frames the time is spent in, outermost first
TAILS = {"busy": ["spin"], "sorted": ["key_of", "spin"], "generator": ["numbers", "spin"],
         "exception": ["handle", "spin"]}
DEBIAN_PYTHON = "/usr/bin/python3.11"
# samples a share is judged on: a loaded machine gives the program less
# CPU time, so fewer samples in its seconds
MIN_SAMPLES = 40
EVAL = "_PyEval_EvalFrameDefault"


def natives_between_leaf_and_key(chained) -> Counter:
    """(py, native) frame lists with counts (chains()) of the `sorted`
    program: the native frames between leaf and the key function sorted()
    calls back, counted; and none of the eval loop's C frames left above a
    Python frame (each that ran one gave way to it)."""
    between = Counter()
    for frames, n in chained:
        seq = [py or "" for py, _ in frames]
        if "leaf" in seq and "key_of" in seq:
            i, j = seq.index("leaf"), seq.index("key_of")
            between[tuple(native for py, native in frames[i + 1:j])] += n
        last_python = max((k for k, (py, _) in enumerate(frames) if py), default=0)
        assert not any(native == EVAL for _py, native in frames[:last_python]), \
            f"an eval frame was left above a Python frame: {frames}"
    return between


def pyenv_python(version: str) -> str:
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3"))
    if not found:
        pytest.skip(f"no CPython {version} under /root/.pyenv/versions")
    return found[-1]


def python_name(frame: dict, names: dict) -> str | None:
    """The name of a Python frame of the program (or of another file:
    '?'), None for a native frame."""
    parts = python_frame_parts(int(frame["address"], 16))
    if parts is not None:
        return names.get(parts[0], "?")
    if frame["module"].endswith(".py") or frame.get("kind") == "python":
        # (site.py's main() at start-up is not the program's)
        return frame["function"] if frame["module"] == PROG.name else "?"
    return None


def chains(stacks: list, facts: dict) -> list:
    """[(frames outermost first as (python name | None, native function), count)]."""
    names = {address: name for name, address in facts["codes"].items()}
    return [([(python_name(f, names), f["function"]) for f in reversed(s["frames"])],
             s["count"]) for s in stacks]


def python_only(frames: list) -> list:
    return [py for py, _native in frames if py is not None]


def start_waiting(python: str, mode: str) -> tuple:
    """frames.py MODE running until its stdin closes, and its facts (read
    from its first line: it is working by then)."""
    proc = subprocess.Popen([python, str(PROG), mode, "stdin"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


# stacks ustack unwinds itself from their copies: every one, as the kernel
# hands them over unwalked where an object's rows do not fit the table
# (--unwind-memory 1), and as perf's DWARF samples all are
COPIED_STACKS = [pytest.param(("--unwind-memory", "1"), id="rows-did-not-fit"),
                 pytest.param(("--backend", "perf", "--unwind", "dwarf"), id="perf")]


def profile_copied(tmp_path, copied: tuple, command: str) -> list:
    """parse_folded() of a 199 Hz profile of `command` whose every stack
    is copied as COPIED_STACKS' `copied` asks (its rows said not to fit)."""
    out = tmp_path / "copied.folded"
    res = ok(run_ustack("profile", "-F", "199", *copied, "-f", "folded",
                        "-o", str(out), "-c", command))
    assert "did not fit" in res.stderr or "--unwind-memory" not in copied, res.stderr
    return parse_folded(out.read_text())
