"""Shared test helpers: build the target programs, run ustack, ask gdb.

Target programs live in tests/programs/ as sources and are compiled on demand
into a content-addressed cache (/tmp/ustack-test-bin/<hash>/, or
$USTACK_TEST_BIN), so repeated runs and variants cost nothing.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

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
_LIBS = {"threads": ["-pthread"], "dlopen_main": ["-ldl"], "usdt_dl": ["-ldl"]}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (needed to build/run test programs)")
    return path


def _cached(key: str, filename: str) -> tuple[Path, Path]:
    """(final output path, temporary path in the same directory). Each
    checkout gets files of its own: a uprobe is set on a file (inode), and a
    system-wide one from another checkout's suite would fire in this one's
    processes (gdb's breakpoint there never stops, samples land in [uprobes])."""
    key = f"{PROGRAMS}\0{key}"
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
    kids = [int(c) for t in Path(f"/proc/{pid}/task").iterdir()
            for c in (t / "children").read_text().split()]
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
