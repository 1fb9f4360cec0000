"""Uprobes defined through tracefs `uprobe_events`, opened as tracepoints.

Why not the uprobe PMU: an inherited uprobe-PMU event makes the target's
clone() fail with EFAULT (on inheritance the kernel re-reads the path
pointer in attr.config1 from the *target's* memory), so threaded programs
and Go crash under -p/-c. Tracepoint events inherit cleanly.

Every probe lives in a group named after the ustack process that made it
(`ustack_<pid>`, see run_lock), is removed when the run ends; a killed
run's are removed by its guardian, or by a later run once the run's lock
proves it dead (see leftovers)."""
from __future__ import annotations

import os
import re

from ..model import UstackError
from . import run_lock
from .run_lock import GROUP_PREFIX  # noqa: F401  (the name's prefix, for callers)
from .tracefs import tracefs_root


def _write(line: str) -> None:
    """Append one command to uprobe_events. Only a missing uprobe_events
    means no uprobe support: a write's ENOENT is the kernel refusing the
    command (a file it cannot find, a probe that is not there), left to
    the caller as the OSError it is."""
    path = os.path.join(tracefs_root(), "uprobe_events")
    try:
        # O_APPEND without O_TRUNC (which would delete every uprobe); not
        # Python's "a" mode, whose lseek tracefs rejects with EINVAL
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        raise UstackError("this kernel has no uprobe support (no uprobe_events)")
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def event_format(event: str) -> str:
    """The format file of events/GROUP/NAME/ (its id and record fields)."""
    try:
        with open(os.path.join(tracefs_root(), "events", event, "format")) as f:
            return f.read()
    except OSError as e:
        raise UstackError(f"uprobe {event} has no format: {e.strerror}")


def _error_log() -> list:
    try:
        with open(os.path.join(tracefs_root(), "error_log")) as f:
            return f.read().splitlines()
    except OSError:
        return []


def _new_error(before: list) -> str:
    """The kernel's reason for the last refusal, from tracefs error_log
    ("trace_uprobe: error: Invalid register name", then the command and a
    caret under the offending word): 'Invalid register name (at '%zz')'."""
    lines = _error_log()
    new = lines[len(before):] if lines[:len(before)] == before else lines[-3:]
    for i in range(len(new) - 1, -1, -1):
        _, sep, why = new[i].partition(" error: ")
        if not sep:
            continue
        why = why.strip()
        if i + 2 < len(new) and "Command: " in new[i + 1]:
            cmd, caret = new[i + 1], new[i + 2]
            at = caret.find("^")
            if 0 <= at < len(cmd):
                word = cmd[cmd.rfind(" ", 0, at) + 1:].split(" ")[0]
                word = re.sub(r"^[A-Za-z_]\w*=", "", word)   # names are checked before
                if word:
                    why += f" (at '{word}')"
        return why
    return ""


def defined_events() -> list:
    """'group/name' of every uprobe defined now, ours and others'."""
    try:
        with open(os.path.join(tracefs_root(), "uprobe_events")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    # "p:group/name /path:0x… args" (r: for a uretprobe)
    return [line.split()[0].partition(":")[2] for line in lines if line.strip()]


def remove_event(event: str) -> None:
    """Remove the uprobe 'group/name'; OSError if the kernel refuses (EBUSY
    while a perf event or enabled instance uses it, ENOENT if it is gone)."""
    _write(f"-:{event}")


class UprobeEvents:
    """The probes of one run; `close()` removes every one it created."""

    def __init__(self):
        self.group = run_lock.tracing_name()
        self.names: list = []
        self._locked = False            # run_lock.hold() taken for our probes

    def define(self, path: str, file_offset: int, ret: bool, hint: str,
               args: tuple = (), what: str = "", ref_ctr: int = 0) -> str:
        """Define a probe with fetch-args `args` ('name=fetch:type' words);
        return its 'group/name'. `what` names it in error messages;
        `ref_ctr`: the file offset of a 2-byte counter the kernel raises
        while the probe is in place (a USDT semaphore), 0 for none."""
        if any(c.isspace() for c in path):
            raise UstackError(f"cannot probe {path!r}: uprobe_events cannot "
                              "take a path with spaces")
        base = re.sub(r"[^A-Za-z0-9_]", "_", hint)[:40] or "probe"
        name = f"{'r' if ret else 'p'}{len(self.names)}_{base}"
        if not self._locked:             # the lock before the first probe
            run_lock.hold()
            self._locked = True
        log_before = _error_log()
        try:
            _write(f"{'r' if ret else 'p'}:{self.group}/{name} "
                   f"{path}:0x{file_offset:x}"
                   + (f"(0x{ref_ctr:x})" if ref_ctr else "") + "".join(" " + a for a in args))
        except OSError as e:
            if not self.names:
                self.close()            # nothing of ours exists: drop the lock
            why = _new_error(log_before) or os.strerror(e.errno)
            raise UstackError(f"the kernel refused "
                              f"{what or f'a uprobe at {path}:0x{file_offset:x}'}: {why}")
        self.names.append(name)
        return f"{self.group}/{name}"

    def forget(self) -> None:
        """Leave our probes to another process to remove (one that holds
        their perf events: see capture/closer.py)."""
        self.names.clear()

    def close(self) -> None:
        """Remove our probes (after their perf events are closed: EBUSY before)."""
        for name in reversed(self.names):
            try:
                remove_event(f"{self.group}/{name}")
            except OSError:
                pass
        self.names.clear()
        if self._locked:
            self._locked = False
            run_lock.release()
