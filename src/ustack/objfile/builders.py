"""Child processes that build an object's cached facts while the run goes
on (objfile/function_child.py: its functions; unwind/rows_builder.py:
its CFI and in-kernel rows): on another CPU, outside this process's GIL,
their memory returned when they exit (what a child does:
objfile/builder_child.py). Each job is keyed (its kind and the
object's path) and the cache directory it writes to (a child inherits
USTACK_CACHE_DIR as it was when started: one building for another
directory is not this one's), and runs once at a time: whoever needs the
facts waits for it and reads what it wrote to the cache. A child that
has ended is started anew when asked again: its callers ask only while
the cache lacks the entry (the cache emptied, the file rewritten at the
same path), and a long-lived API user got the ended child and built
nothing apart.

Which builders a run starts, and why (none starts another):
- rows (unwind/tables.py): a -p/-c run's for its target's objects the
  cache lacks, waited for where the run needs them; a whole-machine run's
  only for the objects its samples met (the in-kernel walk's WANTED map,
  capture/lazy_rows.py) and the objects every stack of a running
  interpreter goes through, at BACKGROUND_NICENESS: never for every
  object the machine maps. The lazy loader's go to one long-lived rows
  builder (`shared`, below); the others each have a child of their own.
- functions (objfile/function_builder.py): an object whose symbol tables
  are big (>= 512 KiB), when it is opened: a sampled object, and, ahead
  of their first sample, the biggest objects of the processes running as
  a whole-machine or -p run starts (target/busy_objects.py, at most 4: a
  cold run with busy node and CPython ended in 3.50 s vs 4.18 s, its
  names no longer waited for at the end). Nothing waits for them when
  they start, so they start at NOTHING_WAITS_NICENESS (a busy machine's
  work first, an object never sampled costs it little) and get the run's
  niceness back when the run waits for their names (wait(run_waits=True)).
  A whole-machine run's middle-sized objects (symbol tables of 32-512
  KiB: libcrypto, libpython, libc's debug file), when first named: one
  long-lived functions builder (`shared`) builds them for the cache while
  the run names them by a scan (function_builder.start_shared).

A run stops, as it ends (stop_unneeded), the builders of objects it
neither waited for nor named: a head start for an object never sampled
(a ClickHouse server's 82 MB library, running as a whole-machine run
began) does not outlive the run.

The `ustack` command leaves with os._exit (cli.entry) and lets a builder
still running finish its one object and end (~1-2 s for node; a rows
builder nothing waited for runs nicer, so longer on a busy machine): the
next run, often the same command again, then finds it cached, where a
builder stopped at every exit would start over each time and never
finish within short runs.

A kind of job the run asks for many objects, one after another (the lazy
row loader's rows: libpython, libstdc++, libcrypto, ... in a
whole-machine run; the functions of the objects it names), goes to one
long-lived child of its module
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
import sys
import threading
import time

from ..interrupt import current
from .cache import cache_root

STOP_WAIT_S = 0.5               # for builders to leave on SIGTERM, before SIGKILL
WAIT_SLICE_S = 0.05             # a wait for a builder looks at Ctrl-C this often

_children: dict = {}            # (cache directory, (kind, path, ...)) -> _Job
_workers: dict = {}             # (cache directory, module) -> _Worker: its long-lived child
_lock = threading.Lock()
_registered: list = []          # stop_all registered with atexit (once)
_needed: set = set()            # _own() keys the run waited for, or named the object of
in_builder = False              # this process is a builder: it builds what it is asked, here


def start(key: tuple, module: str, args: list, niceness: int = 0, shared: bool = False):
    """Run `python -m module *args` for `key` unless it runs already for
    this cache directory; the child (a Popen), or None when it could not
    start (build here). `niceness`: added to the child's, as nice(1)
    does, for work nothing waits for (yet: see wait()). `shared`: the job
    goes to the one long-lived child of `module` (`python -m module
    --jobs`, its main calling builder_child.serve()), started with the
    first such job, and its niceness is the job's while it builds."""
    if in_builder:
        return None
    with _lock:
        kept = _children.get(_own(key))
        if kept is not None and not kept.finished():
            return kept.proc
        _needed.discard(_own(key))      # a new child: not needed until asked
        if not _registered:
            _registered.append(True)
            atexit.register(stop_all)
        if shared:
            worker = _workers.get((cache_root(), module))
            if worker is None or worker.proc.poll() is not None:
                proc = _popen(module, ["--jobs"])
                if proc is None:
                    return None
                worker = _workers[(cache_root(), module)] = _Worker(proc)
            _children[_own(key)] = worker.submit(args, niceness)
            return worker.proc
        proc = _popen(module, args)
        if proc is None:
            return None
        _children[_own(key)] = _Job(proc)
        if niceness:                    # the child's alone: a nicer thread would hold the GIL
            _nicer(proc.pid, niceness)
        return proc


def _own(key: tuple) -> tuple:
    """`key` in the cache directory this process writes to now."""
    return (cache_root(), key)


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
    child as it is sent; the child writes the number back when it is done.
    The child's end (crash, kill) finishes every job it still had: their
    callers find no cache entry and build here."""

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
    """The child `pid` at least `niceness` nicer than this process (once:
    a child started nicer is not made nicer again)."""
    try:
        _set_niceness(pid, max(os.getpriority(os.PRIO_PROCESS, pid),
                               os.getpriority(os.PRIO_PROCESS, 0) + niceness))
    except OSError:
        pass                            # it ended meanwhile


def _set_niceness(pid: int, niceness: int) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, niceness))
    except OSError:
        pass                            # it ended meanwhile, or may not be made less nice


def nothing_waits(key: tuple, niceness: int) -> None:
    """The run no longer waits for the child of `key` (it has what it
    needs another way): `niceness` more than this process's, so it takes the
    CPU from the run's own work only where that leaves some; it goes on
    for the cache."""
    with _lock:
        job = _children.get(_own(key))
        _needed.add(_own(key))
    if job is not None and not job.finished():
        _nicer(job.proc.pid, niceness)


def wait(key: tuple, run_waits: bool = False) -> None:
    """Wait for the child of `key`, if one was started. A run asked to end
    meanwhile (interrupt.current()) stops waiting at once (Interrupted);
    the child finishes its object for the next run. `run_waits`: the
    run's own work waits now, so a child started nicer (ahead of need)
    gets this process's niceness back, where it may (root: a user's
    process cannot lower a niceness)."""
    with _lock:
        job = _children.get(_own(key))
        _needed.add(_own(key))
    if job is None:
        return
    if run_waits and not job.finished():
        _set_niceness(job.proc.pid, os.getpriority(os.PRIO_PROCESS, 0))
    interrupt = current()
    while True:
        interrupt.check()
        if job.wait(WAIT_SLICE_S):
            return


def running(key: tuple) -> bool:
    """Whether the child of `key` was started and has not ended."""
    with _lock:
        job = _children.get(_own(key))
    return job is not None and not job.finished()


def stop_unneeded() -> None:
    """The run is over: stop the builders it started ahead of need (a
    head start for a running process's object) whose object it never
    waited for nor named: nothing says the next run meets it either, and
    they would outlive the run by seconds. Those it needed go on for the
    cache, and so does a long-lived builder (it leaves once idle)."""
    with _lock:
        unneeded = [key for key in _children if key not in _needed]
        jobs = [_children.pop(key) for key in unneeded]
    _stop([job.proc for job in jobs if job.done is None])


def stop_all() -> None:
    """Stop the builders still running: the run is over (SIGTERM, then
    SIGKILL for one still there after STOP_WAIT_S)."""
    with _lock:
        children = [job.proc for job in _children.values()]
        children += [w.proc for w in _workers.values()]
        _children.clear()
        _workers.clear()
        _needed.clear()
    _stop(children)


def _stop(children: list) -> None:
    running = list({id(c): c for c in children if c.poll() is None}.values())
    if not running:
        return                  # every run ends here: a short one imports no subprocess
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
