"""A private ftrace instance (tracefs instances/ustack_<pid>): its own ring
buffer, options, pid filter and event switches, so the global buffer,
trace_options and other users' tracing are never touched. Removing the
directory removes all of it; a killed run's instance is removed by its
guardian, or by a later run once the run's lock proves it dead (see
leftovers)."""
from __future__ import annotations

import errno
import os
import re

from ..model import UstackError
from . import run_lock
from .tracefs import tracefs_root

ENOTSUPP = 524                    # the kernel's internal 'not supported' (no libc name)

# compiled at first use (re's cache): tracefs runs only
_STAT_RE = r"(?m)^(overrun|dropped events|entries|commit overrun):\s*(\d+)"


# The run's second instance, of the processes' fork and exec records
# (capture/tracefs.py): without the user stacks of the run's own and apart
# from its events, so a lost one is counted as such, never as an event,
# and a flood of events cannot overwrite it
PROCESSES_SUFFIX = "_procs"


def run_instances(name: str) -> list:
    """The instances run `name` makes: its events', its processes'."""
    return [name, name + PROCESSES_SUFFIX]


def _instances_dir() -> str:
    return os.path.join(tracefs_root(), "instances")


def instance_names() -> list:
    """The names of every ftrace instance now, ours and others'."""
    try:
        return os.listdir(_instances_dir())
    except OSError:
        return []


def remove_instance(name: str) -> bool:
    """Remove instances/NAME (its events switched off first); False if the
    kernel refuses (files still open)."""
    return _remove(os.path.join(_instances_dir(), name))


def _remove(path: str) -> bool:
    """rmdir an instance; the kernel refuses (EBUSY) while enabled events
    or open files hold it, so switch its events off first."""
    _try_write(os.path.join(path, "events", "enable"), "0")
    _try_write(os.path.join(path, "tracing_on"), "0")
    try:
        os.rmdir(path)
        return True
    except OSError:
        return False


def _try_write(path: str, value: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(value)
        return True
    except OSError:
        return False


class FtraceInstance:
    """instances/<our tracing name><suffix>; close() removes it."""

    def __init__(self, suffix: str = ""):
        self.name = run_lock.tracing_name() + suffix
        self.path = os.path.join(_instances_dir(), self.name)
        self.created = False
        self._locked = False            # run_lock.hold() taken for it
        self.fds: dict = {}             # cpu -> trace_pipe_raw fd

    def create(self) -> None:
        if not self._locked:
            run_lock.hold()
            self._locked = True
        try:
            os.mkdir(self.path)
        except FileExistsError:          # a dead process with our pid left it
            if not _remove(self.path):
                raise UstackError(f"tracefs instance {self.path} exists and is busy")
            os.mkdir(self.path)
        except OSError as e:
            if e.errno == errno.ENOENT:
                raise UstackError("this kernel's tracefs has no instances directory")
            raise UstackError(f"cannot create tracefs instance {self.path}: {e.strerror}")
        self.created = True

    def write(self, rel: str, value: str, what: str = "") -> None:
        try:
            with open(os.path.join(self.path, rel), "w") as f:
                f.write(value)
        except OSError as e:
            why = e.strerror
            if e.errno == ENOTSUPP:
                why = ("the kernel refused it (error 524, ENOTSUPP: for a uprobe, "
                       "an instruction it cannot single-step or emulate)")
            raise UstackError(f"cannot set {what or rel} of tracefs instance "
                              f"{self.name}: {why}")

    def option(self, name: str, on: bool) -> None:
        self.write(f"options/{name}", "1" if on else "0", f"option {name}")

    def enable(self, group: str, name: str) -> None:
        self.write(f"events/{group}/{name}/enable", "1", f"event {group}:{name}")

    def open_pipes(self, cpus: list) -> None:
        """Open every CPU's trace_pipe_raw (non-blocking) into self.fds."""
        for cpu in cpus:
            path = os.path.join(self.path, "per_cpu", f"cpu{cpu}", "trace_pipe_raw")
            try:
                self.fds[cpu] = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                raise UstackError(f"cannot open {path}: {e.strerror}")

    def lost(self) -> int:
        """Entries the buffer had no room for (overwritten, dropped, or
        refused while a small buffer wrapped onto its commit page), from
        per_cpu/cpuN/stats, summed over CPUs."""
        total = 0
        for cpu in self.fds:
            try:
                with open(os.path.join(self.path, "per_cpu", f"cpu{cpu}", "stats")) as f:
                    text = f.read()
            except OSError:
                continue
            stats = dict(re.findall(_STAT_RE, text))
            total += sum(int(stats.get(name, 0))
                         for name in ("overrun", "dropped events", "commit overrun"))
        return total

    def close(self) -> None:
        for fd in self.fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds.clear()
        if self.created:
            self.created = not _remove(self.path)
        if self._locked and not self.created:
            self._locked = False
            run_lock.release()
