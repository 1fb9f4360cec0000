"""Every way a run ends, on every backend, leaves nothing behind: no
uprobe (uprobe_events lines of the run), no tracefs instance, no changed
ftrace option (conftest's leak check judges these three after every test),
no BPF program, map or link of the run (the ids its fdinfo showed while it
ran no longer exist), no stopped or still-traced process, and a target
ustack did not start (-p) still running. After a SIGKILL of ustack and
its guardian the next run, of another backend, removes what the killed
one left (tests/test_run_lifecycle.py: what the guardian alone removes).

Backends: perf, bpf, tracefs, and bpf with the in-kernel DWARF unwinder
(`--unwind auto` on code without frame pointers). Endings: the target
exits, -d, SIGINT, SIGTERM, SIGKILL of ustack, SIGKILL of the target,
stdout closed by its reader (`| head -1`), an error after start (-o
/dev/full: the disk is full)."""
from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import FP, build, kill_run_and_guardian, popen_ustack, run_ustack, wait_until

pytestmark = pytest.mark.kernel

TRACEFS = Path("/sys/kernel/tracing")
NOFP = ("-O2", "-g", "-fomit-frame-pointer")

# backend -> (command, backend options, compiler flags of the target, header text)
BACKENDS = {
    "perf": ("trace", ["--backend", "perf", "--unwind", "fp"], FP, "[backend perf, unwind fp]"),
    "bpf": ("count", ["--backend", "bpf", "--unwind", "fp"], FP, "[backend bpf, unwind fp]"),
    "tracefs": ("trace", ["--backend", "tracefs"], FP, "[backend tracefs, unwind "),
    "bpf-dwarf": ("count", ["--backend", "bpf", "--unwind", "auto"], NOFP,
                  "[backend bpf, unwind dwarf; unwound in the kernel]"),
}
# after a SIGKILL, the next run is of another backend: every backend
# cleans every backend's leftovers
NEXT = {"perf": "tracefs", "bpf": "tracefs", "tracefs": "perf", "bpf-dwarf": "perf"}
ENDINGS = ["exits", "duration", "SIGINT", "SIGTERM", "SIGKILL-ustack",
           "SIGKILL-target", "stdout-closed", "error"]


# -- what a run holds ---------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_NR_BPF = 321                                   # x86-64
_GET_FD_BY_ID = {"prog_id": 13, "map_id": 14, "link_id": 30}


def bpf_objects(pid: int) -> set:
    """(kind, id) of the BPF programs, maps and links process `pid` holds."""
    found = set()
    fdinfo = Path(f"/proc/{pid}/fdinfo")
    for f in fdinfo.iterdir():
        try:
            text = f.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in _GET_FD_BY_ID:
                found.add((key, int(value)))
    return found


def bpf_object_exists(kind: str, ident: int) -> bool:
    attr = (ctypes.c_uint32 * 4)(ident, 0, 0, 0)
    fd = _libc.syscall(_NR_BPF, _GET_FD_BY_ID[kind], attr, ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return True
    assert ctypes.get_errno() == 2, os.strerror(ctypes.get_errno())   # ENOENT
    return False


def probe_lines(pid: int) -> list:
    return [l for f in ("uprobe_events", "dynamic_events")
            for l in (TRACEFS / f).read_text().splitlines() if f":ustack_{pid}/" in l]


def tracing_state(pid: int) -> tuple:
    """(probe lines, instance exists) of the ustack run `pid`."""
    return probe_lines(pid), (TRACEFS / "instances" / f"ustack_{pid}").exists()


def process_state(pid: int) -> tuple:
    """(state letter, tracer pid) of a live process."""
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    status = Path(f"/proc/{pid}/status").read_text()
    tracer = int(status.split("TracerPid:")[1].split()[0])
    return state, tracer


# -- the runs -------------------------------------------------------------------

def spawn(*argv) -> subprocess.Popen:
    """A -p target, reaped by a thread the moment it exits (as a shell does)."""
    proc = subprocess.Popen([str(a) for a in argv])
    threading.Thread(target=proc.wait, daemon=True).start()
    return proc


def wait_tracing(us: subprocess.Popen, header: str) -> None:
    ready, _, _ = select.select([us.stderr], [], [], 30)
    line = us.stderr.readline() if ready else ""
    if not line.startswith("Tracing "):
        us.kill()
        pytest.fail(f"ustack did not start tracing: {line}{us.communicate()[1]}")
    assert header in line, line


def end_of(us: subprocess.Popen, timeout: float = 20, stdin=None) -> str:
    """stderr of a run expected to end by itself."""
    try:
        return us.communicate(stdin, timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        us.send_signal(signal.SIGINT)
        us.communicate()
        pytest.fail(f"ustack did not end within {timeout} s")


@pytest.fixture(scope="module")
def programs():
    return {flags: build("chain", flags=flags) for flags in (FP, NOFP)}


@pytest.mark.parametrize("ending", ENDINGS)
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_ending_leaves_nothing(backend, ending, programs, tmp_path):
    command, backend_args, flags, header = BACKENDS[backend]
    prog = tmp_path / "chain"                     # its own inode: our probes only
    shutil.copy2(programs[flags], prog)
    args = [command, f"uprobe:{prog}:d", *backend_args]
    if ending == "duration" or (command == "count" and ending in ("stdout-closed", "error")):
        args += ["-d", "1"]                       # a count's report comes at the end
    if ending == "error":
        args += ["-o", "/dev/full"]

    target = None
    if ending == "exits":                         # -c: the command runs, then exits
        args += ["-c", f"sh -c 'read go; exec {prog} 20000'"]
    else:
        target = spawn(prog, 10 ** 12)
        args += ["-p", target.pid]
    us = popen_ustack(*args, stderr=subprocess.PIPE, text=True,
                      stdin=subprocess.PIPE if ending == "exits" else None,
                      stdout=subprocess.PIPE if ending == "stdout-closed" else
                      subprocess.DEVNULL)
    try:
        wait_tracing(us, header)
        held = bpf_objects(us.pid)
        if backend.startswith("bpf"):
            assert any(k == "prog_id" for k, _ in held), "no BPF program: proves nothing"
        status, err = end(ending, us, target, command)
        assert "Traceback" not in err, err
        if ending == "SIGKILL-ustack":
            assert status == -signal.SIGKILL
            next_run(backend, prog, us.pid)
        elif ending == "error":
            assert status == 1, err
            assert err.splitlines()[-1] == "ustack: -o /dev/full: No space left on device"
            assert Path("/dev/full").is_char_device(), "-o replaced the device node"
        else:
            assert status == 0, err
        assert tracing_state(us.pid) == ([], False)
        wait_until(lambda: not any(bpf_object_exists(*o) for o in held), timeout=10,
                   what=f"the end of the run's BPF objects {sorted(held)}")
        if target is not None and ending != "SIGKILL-target":
            assert target.poll() is None, "the target died"
            state, tracer = process_state(target.pid)
            assert state not in "tT" and tracer == 0, (state, tracer)
    finally:
        if us.poll() is None:                     # a failed check: end it cleanly
            us.send_signal(signal.SIGINT)
            try:
                us.wait(timeout=10)
            except subprocess.TimeoutExpired:
                us.kill()
                us.wait()
        if target is not None and target.poll() is None:
            target.kill()
            target.wait()


def end(ending: str, us: subprocess.Popen, target, command: str) -> tuple:
    """End the run the way `ending` says; (ustack's exit status, stderr)."""
    if ending == "exits":
        err = end_of(us, stdin="go\n")
        return us.returncode, err
    if ending in ("SIGINT", "SIGTERM"):
        us.send_signal(getattr(signal, ending))
    elif ending == "SIGKILL-ustack":              # its guardian too: see next_run
        kill_run_and_guardian(us)
    elif ending == "SIGKILL-target":
        target.kill()
    elif ending == "stdout-closed":
        if command == "trace":
            us.stdout.readline()                  # a stack came: the reader leaves
        us.stdout.close()
    err = end_of(us)
    return us.returncode, err


def next_run(backend: str, prog: Path, killed: int) -> None:
    if not tracing_state(killed)[0]:
        # its lock is free: any ustack run starting meanwhile removes it
        pytest.skip("another ustack run on this machine removed the killed run's "
                    "probes first: nothing left for the next run to prove")
    res = run_ustack("count", f"uprobe:{prog}:d", "-c", f"{prog} 2",
                     "--backend", NEXT[backend], timeout=60)
    assert res.returncode == 0, res.stderr
    assert tracing_state(killed) == ([], False), \
        f"a {NEXT[backend]} run left a killed {backend} run's probes or instance"


def test_a_count_written_to_a_fifo_leaves_the_fifo(programs, tmp_path):
    """-o of a device or FIFO (/dev/null, a pipe someone reads) is written
    in place: the finished report used to be renamed over it, so root's
    `count -o /dev/full` replaced the device node with a regular file."""
    prog, fifo = programs[FP], tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        res = run_ustack("count", f"uprobe:{prog}:d", "-c", f"{prog} 3", "-f", "folded",
                         "-o", fifo)
        assert res.returncode == 0, res.stderr
        assert fifo.is_fifo()
        assert os.read(reader, 1 << 16).decode().endswith(";a;b;c;d 3\n")
    finally:
        os.close(reader)
