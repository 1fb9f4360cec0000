"""Child processes that build an object's cached facts while the run goes
on (objfile/function_builder.py: its functions; unwind/rows_builder.py:
its CFI and in-kernel rows): on another CPU, outside this process's GIL,
their memory returned when they exit. Each job is keyed (its kind and the
object's path) and started once; whoever needs the facts waits for it and
reads what it wrote to the cache.

Builders still running when the interpreter exits normally are killed
(atexit: a script using the API). The `ustack` command leaves with
os._exit (cli.entry), so a builder still running then, like one whose
parent was killed outright, ends by itself when its one object is built
(~1-2 s for node) and writes only its cache entry; PR_SET_PDEATHSIG would
fire when the thread that started it ends, not the process. A child
writes only through objfile/cache.py, as this process would."""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from pathlib import Path

_children: dict = {}            # (kind, path) -> Popen
_lock = threading.Lock()
in_builder = False              # this process is a builder: it builds what it is asked, here


def start(key: tuple, module: str, args: list, niceness: int = 0):
    """Run `python -m module *args` for `key` unless it was started; the
    child (a Popen), or None when it could not start (build here).
    `niceness`: added to the child's, as nice(1) does, for work nothing
    waits for."""
    if in_builder:
        return None
    with _lock:
        if key in _children:
            return _children[key]
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH")) if p)
        if not _children:
            atexit.register(stop_all)
        try:
            _children[key] = subprocess.Popen(
                [sys.executable, "-m", module, *args], env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            return None
        if niceness:                    # the child's alone: a nicer thread would hold the GIL
            pid = _children[key].pid
            try:
                os.setpriority(os.PRIO_PROCESS, pid,
                               min(19, os.getpriority(os.PRIO_PROCESS, pid) + niceness))
            except OSError:
                pass
        return _children[key]


def wait(key: tuple) -> None:
    """Wait for the child of `key`, if one was started (a signal still
    interrupts the wait)."""
    with _lock:
        child = _children.get(key)
    if child is not None:
        child.wait()


def stop_all() -> None:
    """Kill the builders still running: the run is over."""
    with _lock:
        children = list(_children.values())
        _children.clear()
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()
