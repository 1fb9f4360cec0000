"""The tracing a ustack run left behind when neither it nor its guardian
could remove it (both killed): its ftrace instance and its uprobes, named
after the run (kernel/run_lock.py). The next run removes a name's tracing
only when the run is proven dead: its lock is free. A live run's, or one
whose lock this run cannot see (another mount namespace's /run), stays.

Names made before runs held locks (ustack_<pid>, no lock file) are removed
only where /proc is the initial pid namespace's and shows no such pid;
anywhere else a pid in /proc proves nothing."""
from __future__ import annotations

import os
import re

from .ftrace_instance import PROCESSES_SUFFIX, instance_names, remove_instance, run_instances
from .run_lock import (GROUP_PREFIX, INIT_PID_NS_INO, forget, lock_if_dead,
                       lock_names, pid_namespace_inode, tracing_name)
from .uprobe_events import defined_events, remove_event

_NAME = re.compile(re.escape(GROUP_PREFIX) + r"\d+(?:_\d+)?")
_UNLOCKED = re.compile(re.escape(GROUP_PREFIX) + r"(\d+)")


def remove_stale_tracing() -> int:
    """Remove the instances, then the uprobes, of ustack runs proven dead;
    return how many were removed. What the kernel still refuses stays (and
    so does its lock file) for the next run to retry."""
    groups = _groups()
    names = {n.removesuffix(PROCESSES_SUFFIX) for n in instance_names()
             if _NAME.fullmatch(n.removesuffix(PROCESSES_SUFFIX))}
    names.update(groups)
    locked = {n for n in lock_names() if _NAME.fullmatch(n)}
    names.update(locked)
    names.discard(tracing_name())
    removed = 0
    for name in sorted(names):
        if name in locked:
            fd = lock_if_dead(name)
            if fd is None:
                continue                # alive, or its guardian is at work
        elif _dead_before_locks(name):
            fd = None
        else:
            continue
        gone, left = remove_tracing(name, groups.get(name, ()), until_refused=True)
        removed += gone
        if fd is not None:
            if left:
                os.close(fd)            # the lock file stays: retried later
            else:
                forget(name, fd)
    return removed


def remove_tracing(name: str, events=None, until_refused: bool = False) -> tuple:
    """Remove run `name`'s instance, then its uprobes (the instance's
    enabled events hold them busy): (how many removed, how many left).
    `until_refused`: the uprobes after the first the kernel refuses are
    left for later. A killed run's are busy while its dying process closes
    its perf events (~0.1 s each, under the lock each refusal waits for):
    a run that met 346 of them waited seconds before its own probes."""
    gone = left = 0
    present = instance_names()
    for instance in run_instances(name):
        if instance in present:
            if remove_instance(instance):
                gone += 1
            else:
                left += 1
    if events is None:
        events = _groups().get(name, ())
    events = list(events)
    for i, event in enumerate(events):
        try:
            remove_event(event)
            gone += 1
        except FileNotFoundError:
            pass                        # removed meanwhile
        except OSError:                 # still in use
            if until_refused:
                left += len(events) - i
                break
            left += 1
    return gone, left


def _groups() -> dict:
    """ustack uprobe groups now: name -> ['group/event', ...]."""
    groups: dict = {}
    for event in defined_events():
        group = event.partition("/")[0]
        if _NAME.fullmatch(group):
            groups.setdefault(group, []).append(event)
    return groups


def _dead_before_locks(name: str) -> bool:
    """Whether unlocked `name` is ustack_<pid> of a process that is gone,
    judged in the initial pid namespace (where that pid was counted)."""
    m = _UNLOCKED.fullmatch(name)
    return (m is not None and _proc_is_initial()
            and not os.path.exists(f"/proc/{m.group(1)}"))


def _proc_is_initial() -> bool:
    """Whether we are in the initial pid namespace and /proc counts pids
    as we do (it is that namespace's)."""
    try:
        return (pid_namespace_inode() == INIT_PID_NS_INO
                and os.readlink("/proc/self") == str(os.getpid()))
    except OSError:
        return False
