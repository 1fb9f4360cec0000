"""Child processes that build an object's cached facts while the run goes
on (objfile/function_child.py: its functions; unwind/rows_builder.py:
its CFI and in-kernel rows): on another CPU, outside this process's GIL,
their memory returned when they exit. Each job is keyed (its kind and the
object's path) and the cache directory it writes to (a child inherits
USTACK_CACHE_DIR as it was when started: one building for another
directory is not this one's), and runs once at a time: whoever needs the
facts waits for it and reads what it wrote to the cache. A child that
has ended is started anew when asked again: its callers ask only while
the cache lacks the entry (the cache emptied, the file rewritten at the
same path), and a long-lived API user got the ended child and built
nothing apart.

Which builders a run starts, and why (each builds its one object, then
ends; none starts another):
- rows (unwind/tables.py): a -p/-c run's for its target's objects the
  cache lacks, waited for where the run needs them; a whole-machine run's
  only for the objects its samples met (the in-kernel walk's WANTED map,
  capture/lazy_rows.py) and the objects every stack of a running
  interpreter goes through, at BACKGROUND_NICENESS: never for every
  object the machine maps.
- functions (objfile/function_builder.py): an object whose symbol tables
  are big (>= 512 KiB), when it is opened: a sampled object, and, ahead
  of their first sample, the biggest objects of the processes running as
  a whole-machine or -p run starts (target/busy_objects.py, at most 4: a
  cold run with busy node and CPython ended in 3.50 s vs 4.18 s, its
  names no longer waited for at the end). Nothing waits for them when
  they start, so they start at NOTHING_WAITS_NICENESS (a busy machine's
  work first, an object never sampled costs it little) and get the run's
  niceness back when the run waits for their names (wait(run_waits=True)).

A run stops, as it ends (stop_unneeded), the builders of objects it
neither waited for nor named: a head start for an object never sampled
(a ClickHouse server's 82 MB library, running as a whole-machine run
began) does not outlive the run.

The `ustack` command leaves with os._exit (cli.entry) and lets a builder
still running finish its one object and end (~1-2 s for node; a rows
builder nothing waited for runs nicer, so longer on a busy machine): the
next run, often the same command again, then finds it cached, where a
builder stopped at every exit would start over each time and never
finish within short runs. A script using the API stops them at exit
(atexit: stop_all). SIGTERM ends a builder as SystemExit, so a cache file
it was writing is removed, not left under its temporary name.
PR_SET_PDEATHSIG was not used: it fires when the thread that started the
child ends, not the process. A child writes only through
objfile/cache.py, as this process would."""
from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time

from ..interrupt import current
from .cache import cache_root

STOP_WAIT_S = 0.5               # for builders to leave on SIGTERM, before SIGKILL
WAIT_SLICE_S = 0.05             # a wait for a builder looks at Ctrl-C this often

_children: dict = {}            # (cache directory, (kind, path, ...)) -> Popen
_lock = threading.Lock()
_registered: list = []          # stop_all registered with atexit (once)
_needed: set = set()            # _own() keys the run waited for, or named the object of
in_builder = False              # this process is a builder: it builds what it is asked, here


def start(key: tuple, module: str, args: list, niceness: int = 0):
    """Run `python -m module *args` for `key` unless it runs already for
    this cache directory; the child (a Popen), or None when it could not
    start (build here). `niceness`: added to the child's, as nice(1)
    does, for work nothing waits for (yet: see wait())."""
    if in_builder:
        return None
    with _lock:
        kept = _children.get(_own(key))
        if kept is not None and kept.poll() is None:
            return kept
        _needed.discard(_own(key))      # a new child: not needed until asked
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH")) if p)
        if not _registered:
            _registered.append(True)
            atexit.register(stop_all)
        import subprocess           # here: a warm run starts no builder (~2 ms)
        try:
            child = _children[_own(key)] = subprocess.Popen(
                [sys.executable, "-m", module, *args], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            return None
        if niceness:                    # the child's alone: a nicer thread would hold the GIL
            _nicer(child.pid, niceness)
        return child


def _own(key: tuple) -> tuple:
    """`key` in the cache directory this process writes to now."""
    return (cache_root(), key)


def _nicer(pid: int, niceness: int) -> None:
    """The child `pid` at least `niceness` nicer than this process (once:
    a child started nicer is not made nicer again)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid,
                       min(19, max(os.getpriority(os.PRIO_PROCESS, pid),
                                   os.getpriority(os.PRIO_PROCESS, 0) + niceness)))
    except OSError:
        pass                            # it ended meanwhile


def nothing_waits(key: tuple, niceness: int) -> None:
    """The run no longer waits for the child of `key` (it has what it
    needs another way): `niceness` more than this process's, so it takes the
    CPU from the run's own work only where that leaves some; it goes on
    for the cache."""
    with _lock:
        child = _children.get(_own(key))
        _needed.add(_own(key))
    if child is not None and child.poll() is None:
        _nicer(child.pid, niceness)


def wait(key: tuple, run_waits: bool = False) -> None:
    """Wait for the child of `key`, if one was started. A run asked to end
    meanwhile (interrupt.current()) stops waiting at once (Interrupted);
    the child finishes its object for the next run. `run_waits`: the
    run's own work waits now, so a child started nicer (ahead of need)
    gets this process's niceness back, where it may (root: a user's
    process cannot lower a niceness)."""
    with _lock:
        child = _children.get(_own(key))
        _needed.add(_own(key))
    if child is None:
        return
    if run_waits and child.poll() is None:
        try:
            os.setpriority(os.PRIO_PROCESS, child.pid, os.getpriority(os.PRIO_PROCESS, 0))
        except OSError:
            pass                        # not allowed, or it ended meanwhile
    import subprocess
    interrupt = current()
    while True:
        interrupt.check()
        try:
            child.wait(WAIT_SLICE_S)
            return
        except subprocess.TimeoutExpired:
            pass


def running(key: tuple) -> bool:
    """Whether the child of `key` was started and has not ended."""
    with _lock:
        child = _children.get(_own(key))
    return child is not None and child.poll() is None


def stop_unneeded() -> None:
    """The run is over: stop the builders it started ahead of need (a
    head start for a running process's object) whose object it never
    waited for nor named: nothing says the next run meets it either, and
    they would outlive the run by seconds. Those it needed go on for the
    cache."""
    with _lock:
        unneeded = [key for key in _children if key not in _needed]
        children = [_children.pop(key) for key in unneeded]
    _stop(children)


def stop_all() -> None:
    """Stop the builders still running: the run is over (SIGTERM, then
    SIGKILL for one still there after STOP_WAIT_S)."""
    with _lock:
        children = list(_children.values())
        _children.clear()
        _needed.clear()
    _stop(children)


def _stop(children: list) -> None:
    running = [child for child in children if child.poll() is None]
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


def lock_name(key: tuple) -> str:
    """The name of the lock the builder of `key` holds (objfile/cache.py's
    hold())."""
    return "builder\0" + "\0".join(map(str, key))


def _leave(_signum, _frame):
    sys.exit(1)
