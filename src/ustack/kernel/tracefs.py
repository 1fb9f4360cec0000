"""tracefs: where it is (mounting it if needed), the tracepoints it has
(events/GROUP/NAME) and their ids."""
from __future__ import annotations

import os

from ..model import UstackError

TRACEFS = "/sys/kernel/tracing"


def tracefs_root() -> str:
    """The tracefs mount point, mounting it at /sys/kernel/tracing if needed."""
    if os.path.isdir(os.path.join(TRACEFS, "events")):
        return TRACEFS
    if os.path.isdir("/sys/kernel/debug/tracing/events"):
        return "/sys/kernel/debug/tracing"
    import subprocess
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS],
                       check=True, capture_output=True, text=True)
    except FileNotFoundError:
        raise UstackError("tracefs is not mounted and `mount` is missing")
    except subprocess.CalledProcessError as e:
        why = (e.stderr or "").strip().splitlines()[-1:] or ["mount failed"]
        raise UstackError(f"tracefs is not available: {why[0]}")
    if not os.path.isdir(os.path.join(TRACEFS, "events")):
        raise UstackError("tracefs is not available: no events directory")
    return TRACEFS


def events_dir() -> str:
    return os.path.join(tracefs_root(), "events")


def tracepoint_groups() -> list:
    """The tracepoint groups (syscalls, sched, …), sorted."""
    return _subdirs(events_dir())


def tracepoint_names(group: str) -> list:
    """The tracepoints of one group, sorted; [] for no such group."""
    return _subdirs(os.path.join(events_dir(), group))


def _subdirs(path: str) -> list:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir())
    except OSError:
        return []


def tracepoint_id(group: str, name: str) -> int:
    path = os.path.join(events_dir(), group, name, "id")
    try:
        with open(path) as f:
            return int(f.read())
    except OSError:
        raise UstackError(f"no such tracepoint: {group}:{name}")


def event_format(group: str, name: str) -> str:
    """The `format` file of events/GROUP/NAME (ftrace-internal events such
    as ftrace/user_stack have one, but no id file)."""
    try:
        with open(os.path.join(events_dir(), group, name, "format")) as f:
            return f.read()
    except OSError:
        raise UstackError(f"this kernel's tracefs has no {group}/{name} event")


def saved_comm(pid: int) -> str:
    """The name ftrace saved for a task when it recorded one of its events
    (saved_cmdlines, shared by every instance): what /proc no longer says
    once a short-lived process has exited. "" when unknown."""
    for root in (TRACEFS, "/sys/kernel/debug/tracing"):
        try:
            with open(os.path.join(root, "saved_cmdlines")) as f:
                text = f.read()
        except OSError:
            continue
        prefix = f"{pid} "
        for line in text.splitlines():
            if line.startswith(prefix):
                return line[len(prefix):]
        return ""
    return ""
