"""`ustack dump -p PID`: each thread's stack once, compared with gdb's
`thread apply all bt` on the same process (C), Go's own chain, and each
thread's exact Python frames (pyenv's CPython 3.8-3.13 and Debian's
stripped python3.11); the target goes on exactly as before."""
from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import PROGRAMS, build, build_go, run_ustack, wait_until
from ustack.model import python_frame_word
from ustack.unwind.python_frames import merge

# "Thread 2 (Thread 0x7f… (LWP 4701) "parked"):"
_GDB_THREAD = re.compile(r'^Thread \d+ \(Thread 0x[0-9a-f]+ \(LWP (\d+)\)')
# "#2  0x00005608f9c591ca in side_inner () at …"
_GDB_CALLER = re.compile(r"^#\d+\s+0x([0-9a-f]+) in (\S+) \(")
# " 0x000056124f0ef285 : main_inner+0x25/0x27 [parked] …" or a Python frame
_FRAME = re.compile(r"^ (?:0x([0-9a-f]+)|\s+) : (\S+)")
_HEADER = re.compile(r"^Thread (\d+)/(\d+) (\S+) \((\S)")


def parse_dump(text: str) -> dict:
    """tid -> (comm, state, [(addr or None, function, the whole line)])."""
    threads: dict = {}
    frames = None
    for line in text.splitlines():
        h = _HEADER.match(line)
        if h:
            frames = []
            threads[int(h.group(2))] = (h.group(3), h.group(4), frames)
            continue
        m = _FRAME.match(line)
        if m and frames is not None:
            frames.append((int(m.group(1), 16) if m.group(1) else None,
                           m.group(2).split("+0x")[0], line))
    return threads


def gdb_threads(pid: int) -> dict:
    """tid -> [(return address, function)] of gdb's frames that have one."""
    out = subprocess.run(["gdb", "-q", "-batch", "-p", str(pid), "-ex", "thread apply all bt"],
                         capture_output=True, text=True, timeout=120).stdout
    threads: dict = {}
    cur = None
    for line in out.splitlines():
        t = _GDB_THREAD.match(line)
        if t:
            cur = threads.setdefault(int(t.group(1)), [])
        m = _GDB_CALLER.match(line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), m.group(2)))
    return threads


def in_syscall(pid: int, number: int) -> bool:
    """Whether every thread of pid sits in system call `number`."""
    tids = os.listdir(f"/proc/{pid}/task")
    try:
        return all(open(f"/proc/{pid}/task/{t}/syscall").read().split()[0] == str(number)
                   for t in tids)
    except OSError:
        return False


def finish(proc, lines: int) -> str:
    out, _ = proc.communicate("x\n" * lines, timeout=60)
    assert proc.returncode == 0
    return out


def test_c_threads_match_gdb_and_the_target_goes_on():
    proc = subprocess.Popen([str(build("parked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 2
                   and in_syscall(proc.pid, 0), what="both threads in read(2)")
        r = run_ustack("dump", "-p", proc.pid)
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(rf"ustack: process {proc.pid} stopped for [0-9.]+ ms \(2 threads\)\n",
                            r.stderr)
        ours = parse_dump(r.stdout)
        gdb = gdb_threads(proc.pid)
        assert sorted(ours) == sorted(gdb) == sorted(int(t) for t in
                                                     os.listdir(f"/proc/{proc.pid}/task"))
        chains = {}
        for tid, (comm, state, frames) in ours.items():
            assert (comm, state) == ("parked", "S")
            assert frames[0][1] == "read"
            # gdb's frames (those with a return address) are ours after read, in order
            assert [(a, f) for a, f, _ in frames[1:1 + len(gdb[tid])]] == gdb[tid]
            chains[tid] = [f for _, f, _ in frames]
        assert chains[proc.pid][:4] == ["read", "main_inner", "main_outer", "main"]
        side = [t for t in chains if t != proc.pid][0]
        assert chains[side][:4] == ["read", "side_inner", "side_outer", "side_start"]
        assert chains[side][-2:] == ["start_thread", "clone3"]
        # nothing is left traced, and the program answers as if never stopped
        assert "TracerPid:\t0" in open(f"/proc/{proc.pid}/status").read()
        assert finish(proc, 1) == "side 1\nmain 1\n"
    finally:
        proc.kill()
        proc.wait()


def test_json_output_and_lines(tmp_path):
    proc = subprocess.Popen([str(build("parked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 2
                   and in_syscall(proc.pid, 0), what="both threads in read(2)")
        out = tmp_path / "dump.json"
        r = run_ustack("dump", "-p", proc.pid, "--lines", "-o", out)
        assert r.returncode == 0 and r.stdout == "", r.stderr
        doc = json.loads(out.read_text())
        assert doc["pid"] == proc.pid and doc["stopped_ns"] > 0
        main = [t for t in doc["threads"] if t["tid"] == proc.pid][0]
        named = [(f["function"], f.get("line")) for f in main["frames"][1:4]]
        src = (PROGRAMS / "parked.c").read_text().splitlines()
        assert [n for n, _ in named] == ["main_inner", "main_outer", "main"]
        assert "read(0, buf, size)" in src[named[0][1] - 1]
        assert "main_inner(buf" in src[named[1][1] - 1]
        assert finish(proc, 1) == "side 1\nmain 1\n"
    finally:
        proc.kill()
        proc.wait()


def test_go_chain():
    proc = subprocess.Popen([str(build_go("goparked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: open(f"/proc/{proc.pid}/syscall").read().startswith("0 "),
                   what="main thread in read(2)")
        r = run_ustack("dump", "-p", proc.pid)
        assert r.returncode == 0, r.stderr
        frames = [f for _, f, _ in parse_dump(r.stdout)[proc.pid][2]]
        at = frames.index("main.inner")
        assert frames[at - 1] == "syscall.read"
        assert frames[at:] == ["main.inner", "main.outer", "main.main", "runtime.main",
                               "runtime.goexit.abi0"]
        assert finish(proc, 1) == "line\n"
    finally:
        proc.kill()
        proc.wait()


INTERPRETERS = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))
INTERPRETERS = [p for p in INTERPRETERS
                if re.search(r"/3\.(8|9|1[0-3])\.", p)] + ["/usr/bin/python3.11"]
PARKED_PY = PROGRAMS / "python" / "parked.py"
# where each function of parked.py waits (the line of its call below)
LINES = {"inner": 27, "outer": 31, "main": 39, "<module>": 43,
         "side_inner": 15, "side_outer": 19, "side": 23}


@pytest.mark.parametrize("python", INTERPRETERS)
def test_python_threads(python):
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed")
    proc = subprocess.Popen([python, str(PARKED_PY)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        side_tid = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        wait_until(lambda: open(f"/proc/{proc.pid}/syscall").read().startswith("0 ")
                   and open(f"/proc/{proc.pid}/task/{side_tid[0]}/syscall")
                   .read().startswith("202 "), what="threads parked")
        r = run_ustack("dump", "-p", proc.pid)
        assert r.returncode == 0, r.stderr
        threads = parse_dump(r.stdout)
        for tid, want in ((proc.pid, ["inner", "outer", "main", "<module>"]),
                          (side_tid[0], ["side_inner", "side_outer", "side"])):
            frames = threads[tid][2]
            py = [(f, line) for a, f, line in frames if a is None]
            ours = [(f, line) for f, line in py if f"{PARKED_PY}:" in line]
            assert [f for f, _ in ours] == want, r.stdout
            assert [int(line.rsplit(":", 1)[1]) for _, line in ours] == [LINES[f] for f in want]
            # native frames above the innermost Python frame (the blocking C
            # code) and below the outermost: nothing in between is lost
            assert frames[0][0] is not None and frames[-1][0] is not None
            block = r.stdout.split(f"/{tid} ", 1)[1].split("\n\n")[0]
            assert "\n (" not in block, r.stdout               # no notes
        side_py = [f for a, f, _ in threads[side_tid[0]][2] if a is None]
        assert side_py[3:] in (["Thread.run", "Thread._bootstrap_inner", "Thread._bootstrap"],
                               ["run", "_bootstrap_inner", "_bootstrap"])
        assert finish(proc, 2) == "line\nline\n"
    finally:
        proc.kill()
        proc.wait()


def test_refusals():
    r = run_ustack("dump", "-p", 2)
    assert (r.returncode, r.stdout, r.stderr) == (
        1, "", "ustack: process 2 is a kernel thread: it has no user stack\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    r = run_ustack("dump", "-p", dead.pid)
    assert (r.returncode, r.stderr) == (1, f"ustack: no process {dead.pid}\n")


def test_a_process_whose_maps_cannot_be_read_is_not_called_gone():
    """Root of a user namespace cannot read the maps of a process outside
    it: the process exists, and the error says what is true."""
    import shutil
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    proc = subprocess.Popen(["sleep", "60"])
    try:
        r = run_ustack("dump", "-p", proc.pid,
                       cmd=("unshare", "--user", "--map-root-user", sys.executable,
                            "-m", "ustack"))
        assert (r.returncode, r.stdout, r.stderr) == (
            1, "", f"ustack: process {proc.pid} (sleep) exists, but /proc/{proc.pid}/maps "
                   "cannot be read: Permission denied\n")
    finally:
        proc.kill()
        proc.wait()


def test_refuses_own_process(capsys):
    from ustack.cli import main
    assert main(["dump", "-p", str(os.getpid())]) == 1
    assert capsys.readouterr().err == "ustack: ustack cannot dump its own process\n"


def test_refuses_a_traced_process():
    proc = subprocess.Popen([str(build("parked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    tracer = subprocess.Popen(["strace", "-o", "/dev/null", "-p", str(proc.pid)],
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: f"TracerPid:\t{tracer.pid}\n" in open(f"/proc/{proc.pid}/status").read(),
                   what="strace attached")
        r = run_ustack("dump", "-p", proc.pid)
        assert (r.returncode, r.stderr) == (
            1, f"ustack: process {proc.pid} is already traced by {tracer.pid} (strace); "
               "detach it first\n")
    finally:
        tracer.kill()
        tracer.wait()
        proc.kill()
        proc.wait()


def test_merge_rule():
    """Each eval frame takes the next group; native frames between stay;
    groups left over are a note, never frames."""
    eval_ranges = ((0x1000, 0x2000),)
    a, b = python_frame_word(0x7000, 1), python_frame_word(0x8000, 2)
    c = python_frame_word(0x9000, 3)
    pcs = (0x500, 0x1010, 0x600, 0x1020, 0x700)
    assert merge(pcs, (((0x7000, 1),), ((0x8000, 2), (0x9000, 3))), eval_ranges) == (
        (0x500, a, 0x600, b, c, 0x700), ())
    assert merge(pcs, (((0x7000, 1),), ((0x8000, 2),), ((0x9000, 3),)), eval_ranges) == (
        (0x500, a, 0x600, b, 0x700), ("1 Python frames beyond the native stack",))
    # a return address just past an eval range's end is still the eval call's
    assert merge((0x500, 0x2000), (((0x7000, 1),),), eval_ranges) == ((0x500, a), ())
    # an eval call just starting (innermost, its frame not current yet)
    # stays a C frame; the outer eval frame gets the thread's frames
    assert merge((0x1005, 0x600, 0x1020), (((0x7000, 1),),), eval_ranges) == (
        (0x1005, 0x600, a), ())


CHURN = """
import sys, threading
stop = threading.Event()
def spawn():
    while not stop.is_set():
        t = threading.Thread(target=lambda: None)
        t.start()
        t.join()
threading.Thread(target=spawn).start()
print("ready", flush=True)
sys.stdin.readline()
stop.set()
print("ok", flush=True)
"""


def test_threads_starting_and_ending_during_dumps_never_stay_stopped():
    proc = subprocess.Popen([sys.executable, "-c", CHURN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        for _ in range(5):
            r = run_ustack("dump", "-p", proc.pid)
            assert r.returncode == 0, r.stderr
            assert f"Thread {proc.pid}/{proc.pid} " in r.stdout
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                assert "TracerPid:\t0\n" in open(f"/proc/{proc.pid}/task/{tid}/status").read()
            except (FileNotFoundError, ProcessLookupError):
                pass                                  # ended since (ESRCH mid-exit)
        assert finish(proc, 1) == "ok\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_process_stays_stopped():
    """A process stopped by SIGSTOP is dumped (state T) and left stopped;
    SIGCONT then resumes it as usual."""
    proc = subprocess.Popen([str(build("parked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    tasks = f"/proc/{proc.pid}/task"

    def states():
        return {open(f"{tasks}/{t}/stat").read().rsplit(")", 1)[1].split()[0]
                for t in os.listdir(tasks)}
    try:
        wait_until(lambda: len(os.listdir(tasks)) == 2 and in_syscall(proc.pid, 0),
                   what="both threads in read(2)")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_until(lambda: states() == {"T"}, what="the process stopped")
        r = run_ustack("dump", "-p", proc.pid)
        assert r.returncode == 0, r.stderr
        assert {s for _, s, _ in parse_dump(r.stdout).values()} == {"T"}
        assert states() == {"T"}
        os.kill(proc.pid, signal.SIGCONT)
        assert finish(proc, 1) == "side 1\nmain 1\n"
    finally:
        proc.kill()
        proc.wait()


CHAIN_PY = PROGRAMS / "python" / "dump_chain.py"


@pytest.mark.parametrize("python", INTERPRETERS)
def test_python_frames_around_c_that_calls_back(python):
    """sorted() calls key_of back: its C frames stand between key_of's and
    outer's Python frames, each Python frame at its exact line."""
    if not os.path.exists(python):
        pytest.skip(f"{python} is not installed")
    proc = subprocess.Popen([python, str(CHAIN_PY)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(proc.stdout.readline())
        wait_until(lambda: all(open(f"/proc/{proc.pid}/task/{t}/syscall").read().startswith("0 ")
                               for t in (facts["main"], facts["worker"])),
                   what="both threads in read(2)")
        r = run_ustack("dump", "-p", proc.pid, "-f", "json")
        assert r.returncode == 0, r.stderr
        threads = {t["tid"]: t for t in json.loads(r.stdout)["threads"]}
        lines = facts["lines"]

        def ours(t):
            return [(f["function"], f["line"]) for f in t["frames"]
                    if f["kind"] == "python" and f.get("file") == str(CHAIN_PY)]

        main = threads[facts["main"]]
        assert ours(main) == [(n, lines[n]) for n in
                              ("block_main", "key_of", "outer", "main", "<module>")]
        kinds = [f["function"] if f["kind"] == "python" else None for f in main["frames"]]
        between = kinds[kinds.index("key_of") + 1:kinds.index("outer")]
        assert between and all(k is None for k in between)          # sorted()'s C frames
        assert kinds[0] is None and kinds[-1] is None and not main["notes"]
        worker = threads[facts["worker"]]
        assert ours(worker) == [(n, lines[n]) for n in ("t_inner", "t_outer", "work")]
        out, _ = proc.communicate("go\n", timeout=30)
        assert out == "worker got go\nsorted [3, 2, 1]\n"
    finally:
        proc.kill()
        proc.wait()


def test_stacks_read_in_one_call_survive_an_unreadable_range():
    """dump reads every thread's stack in one process_vm_readv: a range the
    kernel cannot read (page zero; a page made PROT_NONE) comes back empty
    or cut where the readable bytes end, and the ranges after it are still
    read whole."""
    import ctypes
    import mmap
    from ustack.kernel.process_vm import IOV_MAX, read_ranges
    area = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    area.write(b"A" * (2 * mmap.PAGESIZE))
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + mmap.PAGESIZE), mmap.PAGESIZE, 0) == 0
    text = ctypes.create_string_buffer(b"the rest")
    rest = ctypes.addressof(text)
    edge = base + mmap.PAGESIZE - 4                  # 4 readable bytes, then none
    assert read_ranges(os.getpid(), [(base, 6), (16, 8), (edge, 8), (rest, 8)]) == \
        [b"AAAAAA", b"", b"AAAA", b"the rest"]
    assert read_ranges(os.getpid(), [(rest, 8)] * (IOV_MAX + 5)) == [b"the rest"] * (IOV_MAX + 5)
    assert libc.mprotect(ctypes.c_void_p(base + mmap.PAGESIZE), mmap.PAGESIZE, 3) == 0


def test_the_pause_leaves_ustack_as_it_was():
    """The capture runs real-time only while the process is stopped: after
    a dump (through the library), ustack's thread is SCHED_OTHER again."""
    from ustack.commands.dump import dump
    proc = subprocess.Popen([str(build("parked"))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(os.listdir(f"/proc/{proc.pid}/task")) == 2
                   and in_syscall(proc.pid, 0), what="both threads in read(2)")
        before = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
        threads, stopped_ns = dump(proc.pid)
        assert sorted(t.tid for t in threads) == sorted(int(t) for t in
                                                        os.listdir(f"/proc/{proc.pid}/task"))
        assert all(t.frames and t.frames[0].function == "read" for t in threads)
        assert stopped_ns > 0
        assert (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) == before
        assert finish(proc, 1) == "side 1\nmain 1\n"
    finally:
        proc.kill()
        proc.wait()
