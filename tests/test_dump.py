"""`ustack dump -p PID`: each thread's stack once, native and Python, with
the target stopped a moment and going on unchanged. Judged against gdb's
`thread apply all bt` of the same process (run after ustack let it go) and
against the Python program's own account of its frames."""
import glob
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from helpers import O2_NOFP, PROGRAMS, build, run_ustack
from ustack.kernel import ptrace
from ustack.model import python_frame_word
from ustack.unwind.python_frames import LEFT, merge
from ustack.unwind.python_runtime import LAYOUTS

PY_PROGRAM = PROGRAMS / "python" / "dump_chain.py"
# Debian's stripped python3.11 and each pyenv CPython ustack has a layout for
PYTHONS = [p for p in ["/usr/bin/python3.11", *sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3"))]
           if os.path.exists(p) and (p.startswith("/usr") or tuple(
               map(int, p.split("/")[4].split(".")[:2])) in LAYOUTS)]
READ = 0                        # x86-64 read(2)


def _wait_in_read(pid: int, tids) -> None:
    """Until each thread sits in read(2) (/proc/PID/task/TID/syscall): its
    stack is then fixed until the test writes."""
    pending = set(tids)
    while pending:
        for tid in list(pending):
            with open(f"/proc/{pid}/task/{tid}/syscall") as f:
                if f.read().split()[0] == str(READ):
                    pending.discard(tid)
        os.sched_yield()


def _gdb_threads(pid: int) -> dict:
    """tid -> the pcs gdb shows (frames with an address: not #0, not inlined)."""
    out = subprocess.run(["gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off",
                          "-p", str(pid), "-ex", "set backtrace past-main on",
                          "-ex", "thread apply all bt"],
                         capture_output=True, text=True, timeout=60,
                         stdin=subprocess.DEVNULL).stdout
    threads, tid = {}, None
    for line in out.splitlines():
        m = re.match(r"Thread \d+ \(.*LWP (\d+)\)", line)
        if m:
            tid = int(m.group(1))
            threads[tid] = []
        m = re.match(r"#\d+\s+(0x[0-9a-f]+) in ", line)
        if m and tid is not None:
            threads[tid].append(int(m.group(1), 16))
    return threads


@pytest.fixture
def c_target():
    prog = build("dump_threads", flags=O2_NOFP)
    proc = subprocess.Popen([str(prog)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline().split()[1])
    _wait_in_read(proc.pid, (proc.pid, worker))
    yield proc, worker
    proc.kill()
    proc.wait()


def test_c_threads_match_gdb_and_the_program_goes_on(c_target):
    proc, worker = c_target
    res = run_ustack("dump", "-p", proc.pid, "-f", "json")
    assert res.returncode == 0, res.stderr
    dump = json.loads(res.stdout)
    assert re.fullmatch(r"stopped 2 threads of process \d+ for \d+\.\d{3} ms\n", res.stderr)
    threads = {t["tid"]: t for t in dump["threads"]}
    assert set(threads) == {proc.pid, worker}
    names = {tid: [f["function"] for f in t["frames"]] for tid, t in threads.items()}
    assert names[proc.pid][:4] == ["read", "main_inner", "main_outer", "main"]
    assert names[worker][:4] == ["read", "worker_inner", "worker_outer", "worker_start"]
    assert all(t["state"] == "S" and t["comm"] == "dump_threads" and not t["notes"]
               for t in threads.values())
    # gdb, once ustack has let go: the same return addresses, thread by thread
    gdb = _gdb_threads(proc.pid)
    for tid, t in threads.items():
        assert [int(f["address"], 16) for f in t["frames"][1:]] == gdb[tid]
    out, _ = proc.communicate("hello\n", timeout=30)
    assert out == "worker got 6: hello\nmain done\n"
    assert proc.returncode == 0


def test_text_has_a_header_per_thread(c_target):
    proc, worker = c_target
    res = run_ustack("dump", "-p", proc.pid, "--lines")
    assert res.returncode == 0, res.stderr
    blocks = res.stdout.split("\n\n")
    assert blocks[0].splitlines()[0] == f"dump_threads {proc.pid}/{proc.pid} S (sleeping)"
    assert blocks[1].splitlines()[0] == f"dump_threads {proc.pid}/{worker} S (sleeping)"
    inner = blocks[1].splitlines()[2]
    assert re.fullmatch(r" 0x[0-9a-f]{16} : worker_inner\+0x[0-9a-f]+/0x[0-9a-f]+ "
                        r"\[dump_threads\] .*dump_threads\.c:\d+", inner)


def test_a_thread_id_is_refused_naming_its_process(c_target):
    proc, worker = c_target
    res = run_ustack("dump", "-p", worker)
    assert (res.returncode, res.stdout, res.stderr) == (
        1, "", f"ustack: {worker} is a thread of process {proc.pid}: dump -p {proc.pid}\n")


@pytest.mark.parametrize("python", PYTHONS)
def test_python_frames_exact_in_each_thread(python):
    proc = subprocess.Popen([python, str(PY_PROGRAM)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(proc.stdout.readline())
        _wait_in_read(proc.pid, (facts["main"], facts["worker"]))
        res = run_ustack("dump", "-p", proc.pid, "-f", "json")
        assert res.returncode == 0, res.stderr
        threads = {t["tid"]: t for t in json.loads(res.stdout)["threads"]}
        lines = facts["lines"]
        here = str(PY_PROGRAM)

        def python(t):
            return [(f["function"], f["line"]) for f in t["frames"]
                    if f["kind"] == "python" and f["file"] == here]

        main = threads[facts["main"]]
        assert python(main) == [(n, lines[n]) for n in
                                ("block_main", "key_of", "outer", "main", "<module>")]
        kinds = [f["function"] if f["kind"] == "python" else None for f in main["frames"]]
        assert kinds[0] is None                                     # read(2), native
        between = kinds[kinds.index("key_of") + 1:kinds.index("outer")]
        assert between and all(k is None for k in between)          # sorted()'s C frames
        assert kinds[-1] is None                                    # the program's entry
        worker = threads[facts["worker"]]
        assert python(worker) == [(n, lines[n]) for n in ("t_inner", "t_outer", "work")]
        # threading's own (co_qualname from 3.11, co_name before)
        worker_py = [f["function"].removeprefix("Thread.") for f in worker["frames"]
                     if f["kind"] == "python"]
        assert worker_py[3:] == ["run", "_bootstrap_inner", "_bootstrap"]
        assert not main["notes"] and not worker["notes"]
        out, _ = proc.communicate("go\n", timeout=30)
        assert out == "worker got go\nsorted [3, 2, 1]\n"
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


def _no_such_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_refusals_are_one_line():
    gone = _no_such_pid()
    res = run_ustack("dump", "-p", gone)
    assert (res.returncode, res.stdout, res.stderr) == (1, "", f"ustack: no such process: {gone}\n")
    res = run_ustack("dump", "-p", 2)                       # kthreadd
    assert (res.returncode, res.stderr) == (
        1, "ustack: process 2 is a kernel thread: it has no user stack\n")
    res = run_ustack("-c", 'exec "$0" -m ustack dump -p $$', sys.executable, cmd=("sh",))
    assert res.returncode == 1 and res.stderr.startswith("ustack: process ")
    assert res.stderr.endswith(" is ustack itself\n") and res.stderr.count("\n") == 1


def test_a_traced_process_is_refused_naming_its_tracer():
    child = subprocess.Popen(["sleep", "60"], preexec_fn=ptrace.traceme)
    try:
        _, status = os.waitpid(child.pid, 0)                 # stopped at its exec
        assert os.WIFSTOPPED(status)
        res = run_ustack("dump", "-p", child.pid)
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == (f"ustack: process {child.pid} is already traced by process "
                              f"{os.getpid()} ({_comm(os.getpid())}): only one tracer at a time\n")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def _comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as f:
        return f.read().strip()


EVAL = ((0x1000, 0x2000),)


def test_merge_replaces_each_eval_frame_by_its_group():
    a, b, c = python_frame_word(0x100, 1), python_frame_word(0x200, 2), python_frame_word(0x300, 3)
    pcs = (0x5000, 0x1010, 0x6000, 0x1020, 0x7000)
    words, notes = merge(pcs, [[(0x100, 1), (0x200, 2)], [(0x300, 3)]], EVAL)
    assert words == (0x5000, a, b, 0x6000, c, 0x7000) and notes == ()


def test_merge_leaves_the_innermost_eval_frame_without_a_group_as_c():
    # an eval call just starting: its frame is not current yet
    c = python_frame_word(0x300, 3)
    words, notes = merge((0x1005, 0x6000, 0x1020), [[(0x300, 3)]], EVAL)
    assert words == (0x1005, 0x6000, c) and notes == ()


def test_merge_notes_python_frames_left_over():
    words, notes = merge((0x5000, 0x1010), [[(0x100, 1)], [(0x200, 2)]], EVAL)
    assert words == (0x5000, python_frame_word(0x100, 1)) and notes == (LEFT,)


class _Interrupting:
    """A PythonCode whose first remember() is interrupted: by Ctrl-C (SIGINT
    to ustack while the threads are stopped) or by an error."""

    def __init__(self, how):
        self.how = how

    def remember(self, pid, code, version):
        if self.how == "ctrl-c":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            raise RuntimeError("failed while stopped")


@pytest.mark.parametrize("how", ["ctrl-c", "error"])
def test_threads_are_let_go_whatever_ends_the_copy(how):
    from ustack.commands.dump import copy_threads
    from ustack.kernel import procfs
    from ustack.unwind.python_runtime import find_interpreter
    proc = subprocess.Popen([PYTHONS[0], str(PY_PROGRAM)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        facts = json.loads(proc.stdout.readline())
        tids = (facts["main"], facts["worker"])
        _wait_in_read(proc.pid, tids)
        interp = find_interpreter(procfs.executable_mappings(proc.pid))
        with pytest.raises(KeyboardInterrupt if how == "ctrl-c" else RuntimeError):
            copy_threads(proc.pid, interp, _Interrupting(how))
        for tid in tids:
            with open(f"/proc/{proc.pid}/task/{tid}/status") as f:
                status = f.read()
            assert "TracerPid:\t0\n" in status
        _wait_in_read(proc.pid, tids)           # back in the read it was in
        out, _ = proc.communicate("go\n", timeout=30)
        assert out == "worker got go\nsorted [3, 2, 1]\n"
    finally:
        proc.kill()
        proc.wait()
