"""Uprobes defined through tracefs `uprobe_events`, opened as tracepoints.

Why not the uprobe PMU: an inherited uprobe-PMU event makes the target's
clone() fail with EFAULT (on inheritance the kernel re-reads the path
pointer in attr.config1 from the *target's* memory), so threaded programs
and Go crash under -p/-c. Tracepoint events inherit cleanly.

Every probe lives in a group named after the ustack process that made it
(`ustack_<pid>`), is removed when the run ends, and a later run removes the
groups of runs that no longer exist (killed with SIGKILL)."""
from __future__ import annotations

import errno
import os
import re

from ..model import UstackError
from .tracefs import tracefs_root

GROUP_PREFIX = "ustack_"
_GROUP_RE = re.compile(r"^[pr]:" + GROUP_PREFIX + r"(\d+)/(\S+)")


def _write(line: str) -> None:
    path = os.path.join(tracefs_root(), "uprobe_events")
    try:
        # O_APPEND without O_TRUNC (which would delete every uprobe); not
        # Python's "a" mode, whose lseek tracefs rejects with EINVAL
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise UstackError("this kernel has no uprobe support (no uprobe_events)")
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise UstackError("this kernel has no uprobe support")
        raise


def _defined() -> list:
    try:
        with open(os.path.join(tracefs_root(), "uprobe_events")) as f:
            return f.read().splitlines()
    except OSError:
        return []


def remove_stale() -> int:
    """Remove the probes of ustack runs whose process is gone; return how many."""
    removed = 0
    for line in _defined():
        m = _GROUP_RE.match(line)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                _write(f"-:{GROUP_PREFIX}{m.group(1)}/{m.group(2)}")
                removed += 1
            except OSError:
                pass                    # still in use; next run will retry
    return removed


class UprobeEvents:
    """The probes of one run; `close()` removes every one it created."""

    def __init__(self):
        self.group = f"{GROUP_PREFIX}{os.getpid()}"
        self.names: list = []

    def add(self, path: str, file_offset: int, ret: bool, hint: str) -> int:
        """Define a probe and return its tracepoint id."""
        if any(c.isspace() for c in path):
            raise UstackError(f"cannot probe {path!r}: uprobe_events cannot "
                              "take a path with spaces")
        base = re.sub(r"[^A-Za-z0-9_]", "_", hint)[:40] or "probe"
        name = f"{'r' if ret else 'p'}{len(self.names)}_{base}"
        try:
            _write(f"{'r' if ret else 'p'}:{self.group}/{name} "
                   f"{path}:0x{file_offset:x}")
        except OSError as e:
            raise UstackError(f"the kernel refused a uprobe at {path}:"
                              f"0x{file_offset:x}: {os.strerror(e.errno)}")
        self.names.append(name)
        try:
            with open(os.path.join(tracefs_root(), "events", self.group,
                                   name, "id")) as f:
                return int(f.read())
        except OSError as e:
            raise UstackError(f"uprobe {self.group}/{name} has no id: {e.strerror}")

    def close(self) -> None:
        """Remove our probes (after their perf events are closed: EBUSY before)."""
        for name in reversed(self.names):
            try:
                _write(f"-:{self.group}/{name}")
            except OSError:
                pass
        self.names.clear()
