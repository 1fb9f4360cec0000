"""Child processes that build an object's cached facts while the run goes
on (objfile/function_child.py: its functions; unwind/rows_builder.py:
its CFI and in-kernel rows): on another CPU, outside this process's GIL,
their memory returned when they exit. Each job is keyed (its kind and the
object's path) and started once; whoever needs the facts waits for it and
reads what it wrote to the cache.

The `ustack` command leaves with os._exit (cli.entry) and lets a builder
still running finish its one object and end (~1-2 s for node; a rows
builder nothing waited for runs nicer, so longer on a busy machine): the
next run, often the same command again, then finds it cached, where a
builder stopped at every exit would start over each time and never
finish within short runs.

A kind of job the run asks for many objects, one after another (the lazy
row loader's rows: libpython, libstdc++, libcrypto, ... in a
whole-machine run), goes to one long-lived child of its module
(`shared`), fed one job a line over a pipe: one Python start-up and
import for all of them, and the builds on another CPU, outside this
process's GIL. It answers each job with its number when the job's cache
entries are written; at this process's exit its pipe ends, and it
finishes the jobs it was given. A script using the API stops them at exit
(atexit: stop_all). SIGTERM ends a builder as SystemExit, so a cache file
it was writing is removed, not left under its temporary name.
PR_SET_PDEATHSIG was not used: it fires when the thread that started the
child ends, not the process. A child writes only through
objfile/cache.py, as this process would."""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

from ..interrupt import current

STOP_WAIT_S = 0.5               # for builders to leave on SIGTERM, before SIGKILL
WAIT_SLICE_S = 0.05             # a wait for a builder looks at Ctrl-C this often
IDLE_S = 1.0                    # a long-lived builder with no job this long leaves

_children: dict = {}            # (kind, path) -> _Job
_workers: dict = {}             # module -> _Worker: its long-lived child
_lock = threading.Lock()
in_builder = False              # this process is a builder: it builds what it is asked, here


def start(key: tuple, module: str, args: list, niceness: int = 0, shared: bool = False):
    """Run `python -m module *args` for `key` unless it was started; the
    child (a Popen), or None when it could not start (build here).
    `niceness`: added to the child's, as nice(1) does, for work nothing
    waits for. `shared`: the job goes to the one long-lived child of
    `module` (`python -m module --jobs`, its main calling serve()), started
    with the first such job, and its niceness is the job's while it builds."""
    if in_builder:
        return None
    with _lock:
        if key in _children:
            return _children[key].proc
        if not _children and not _workers:
            atexit.register(stop_all)
        if shared:
            worker = _workers.get(module)
            if worker is None or worker.proc.poll() is not None:
                proc = _popen(module, ["--jobs"])
                if proc is None:
                    return None
                worker = _workers[module] = _Worker(proc)
            _children[key] = worker.submit(args, niceness)
            return worker.proc
        proc = _popen(module, args)
        if proc is None:
            return None
        _children[key] = _Job(proc)
        if niceness:                    # the child's alone: a nicer thread would hold the GIL
            _nicer(proc.pid, niceness)
        return proc


def _popen(module: str, args: list):
    """`python -m module *args` with this package first on its path; None
    when it could not start."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_root, env.get("PYTHONPATH")) if p)
    import subprocess           # here: a warm run starts no builder (~2 ms)
    jobs = subprocess.PIPE if args == ["--jobs"] else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, stdin=jobs, stdout=jobs,
            stderr=subprocess.DEVNULL)
    except OSError:
        return None


class _Job:
    """One object's build: a child of its own (`done` None: it is done
    when the child ends), or a job of a worker (`done` set when answered)."""

    def __init__(self, proc, done: threading.Event | None = None):
        self.proc, self.done = proc, done

    def finished(self) -> bool:
        return self.done.is_set() if self.done is not None else self.proc.poll() is not None

    def wait(self, timeout: float) -> bool:
        """Whether the job finished within `timeout` seconds."""
        if self.done is not None:
            return self.done.wait(timeout)
        import subprocess
        try:
            self.proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False


class _Worker:
    """A long-lived builder child and the jobs it was given: a job is a JSON
    line ([its number, the module's arguments]), its niceness set on the
    child as it is sent; the child writes the number back when it is done. The child's end (crash, kill)
    finishes every job it still had: their callers find no cache entry
    and build here."""

    def __init__(self, proc):
        self.proc = proc
        self.jobs: dict = {}            # number -> Event
        self.next = 0
        self._pipe = threading.Lock()
        threading.Thread(target=self._answers, name="ustack-builder-answers",
                         daemon=True).start()

    def submit(self, args: list, niceness: int) -> _Job:
        done = threading.Event()
        with self._pipe:
            number, self.next = self.next, self.next + 1
            self.jobs[number] = done
            _set_niceness(self.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
            try:
                self.proc.stdin.write(json.dumps([number, args]).encode() + b"\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):   # it ended: built here
                done.set()
        return _Job(self.proc, done)

    def _answers(self) -> None:
        try:
            for line in self.proc.stdout:
                done = self.jobs.pop(int(line), None)
                if done is not None:
                    done.set()
        except (OSError, ValueError):
            pass
        for done in list(self.jobs.values()):
            done.set()


def _nicer(pid: int, niceness: int) -> None:
    try:
        _set_niceness(pid, os.getpriority(os.PRIO_PROCESS, pid) + niceness)
    except OSError:
        pass                            # it ended meanwhile


def _set_niceness(pid: int, niceness: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, niceness))
    except OSError:
        pass                            # it ended meanwhile, or may not be made less nice


def nothing_waits(key: tuple, niceness: int) -> None:
    """The run no longer waits for the child of `key` (it has what it
    needs another way): `niceness` added to the child's, so it takes the
    CPU from the run's own work only where that leaves some; it goes on
    for the cache."""
    with _lock:
        job = _children.get(key)
    if job is not None and not job.finished():     # as this process's, plus `niceness`
        _set_niceness(job.proc.pid, os.getpriority(os.PRIO_PROCESS, 0) + niceness)


def wait(key: tuple) -> None:
    """Wait for the child of `key`, if one was started. A run asked to end
    meanwhile (interrupt.current()) stops waiting at once (Interrupted);
    the child finishes its object for the next run."""
    with _lock:
        job = _children.get(key)
    if job is None:
        return
    interrupt = current()
    while True:
        interrupt.check()
        if job.wait(WAIT_SLICE_S):
            return


def running(key: tuple) -> bool:
    """Whether the child of `key` was started and has not ended."""
    with _lock:
        job = _children.get(key)
    return job is not None and not job.finished()


def stop_all() -> None:
    """Stop the builders still running: the run is over (SIGTERM, then
    SIGKILL for one still there after STOP_WAIT_S)."""
    with _lock:
        children = list({id(job.proc): job.proc for job in _children.values()}.values())
        children += [w.proc for w in _workers.values()]
        _children.clear()
        _workers.clear()
    running = list({id(c): c for c in children if c.poll() is None}.values())
    import subprocess
    for child in running:
        child.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for child in running:
        try:
            child.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def become_builder(key: tuple) -> None:
    """What a builder child does first: it builds what it is asked, here;
    SIGTERM (stop_all) ends it as SystemExit, so the files it writes are
    removed when unfinished (output.write_bytes_at); and it waits for a
    builder of another run with the same `key` (one still finishing after
    its run ended), then finds the entry built, so repeated runs on a
    busy machine never pile builders of one object up."""
    global in_builder
    in_builder = True
    signal.signal(signal.SIGTERM, _leave)
    from .cache import hold
    hold(lock_name(key))


def serve(build) -> None:
    """What a long-lived builder child does (started by start(shared=True)):
    builds `build(args)` for each job read from stdin, in turn, each
    answered on stdout when done, until its pipe ends (the run is over:
    the jobs it was given are finished, for the next run) or no job came
    for IDLE_S (the run asks for its objects one after another; an API
    user's process keeps no idle builder). A job sent as it leaves finds
    it gone: its caller builds. SIGTERM ends it as become_builder's does.
    `build` takes its object's lock itself (building())."""
    import select
    global in_builder
    in_builder = True
    signal.signal(signal.SIGTERM, _leave)
    pending = b""
    while True:
        if b"\n" not in pending:
            if not select.select([0], [], [], IDLE_S)[0]:
                return
            more = os.read(0, 1 << 16)
            if not more:
                return
            pending += more
            continue
        line, pending = pending.split(b"\n", 1)
        number, args = json.loads(line)
        try:
            build(args)
        except Exception:       # noqa: BLE001 - its caller finds no entry and builds
            pass
        try:
            os.write(1, b"%d\n" % number)
        except OSError:
            pass                # the run is over: the next jobs are for the cache


@contextmanager
def building(key: tuple):
    """While a long-lived builder builds `key`: the lock become_builder()
    holds for a builder of its own (held until the job ends)."""
    from .cache import hold
    fd = hold(lock_name(key))
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def lock_name(key: tuple) -> str:
    """The name of the lock the builder of `key` holds (objfile/cache.py's
    hold())."""
    return "builder\0" + "\0".join(map(str, key))


def _leave(_signum, _frame):
    sys.exit(1)
