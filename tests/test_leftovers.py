"""kernel/leftovers.py against the real tracefs: what a SIGKILLed run left
(its instance with its uprobe enabled, which holds the probe busy) is
removed by the next run, instance first; a live run's probes stay.

Other ustack runs on this machine remove stale leftovers too, at any
moment, and two removals at once can both be refused (EBUSY): so each
check gets three fresh crashed runs, of which one call must clear one.
A probe-first order would clear none (the instance holds the probe)."""
from __future__ import annotations

import fcntl
import os

import pytest

from ustack.kernel import ftrace_instance, run_lock, uprobe_events
from ustack.kernel.leftovers import remove_stale_tracing
from ustack.kernel.tracefs import tracefs_root
from ustack.kernel.uprobe_events import UprobeEvents, defined_events

pytestmark = pytest.mark.kernel


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _crashed_run(pid, group: str | None = None) -> str:
    """Leave what run `pid` leaves when killed mid-trace; its event name.
    Another ustack run may remove the half-made leftovers at once: retry."""
    for _ in range(20):
        try:
            return _leave_tracing(group or f"ustack_{pid}")
        except FileNotFoundError:
            ftrace_instance.remove_instance(group or f"ustack_{pid}")
    raise AssertionError("other ustack runs kept removing the test's leftovers")


def _leave_tracing(group: str) -> str:
    root = tracefs_root()
    name = "p0_true"
    fd = os.open(os.path.join(root, "uprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"p:{group}/{name} {os.path.realpath('/bin/true')}:0x0\n".encode())
    finally:
        os.close(fd)
    try:
        os.mkdir(os.path.join(root, "instances", group))
    except FileExistsError:
        pass
    with open(os.path.join(root, "instances", group, "events", group, name,
                           "enable"), "w") as f:
        f.write("1")
    return f"{group}/{name}"


def _one_call_clears(remove) -> bool:
    """Whether one call of `remove` clears a fresh crashed run's instance
    and probe."""
    dead = _dead_pid()
    event = _crashed_run(dead)
    try:
        remove()
        return (f"ustack_{dead}" not in ftrace_instance.instance_names()
                and event not in defined_events())
    finally:
        ftrace_instance.remove_instance(f"ustack_{dead}")
        if event in defined_events():
            uprobe_events.remove_event(event)


def test_a_crashed_runs_instance_and_probes_are_removed():
    assert any(_one_call_clears(remove_stale_tracing) for _ in range(3))


def test_a_live_runs_probes_stay():
    events = UprobeEvents()
    event = events.define(os.path.realpath("/bin/true"), 0, False, "live")
    try:
        assert any(_one_call_clears(remove_stale_tracing) for _ in range(3))
        assert event in defined_events()
    finally:
        events.close()


def test_a_crashed_runs_processes_instance_is_removed_alone():
    """A tracefs run keeps the processes' fork and exec records in a second
    instance (NAME_procs): left alone, with its events on, the next run
    removes it too."""
    def one_call_clears() -> bool:
        dead = _dead_pid()
        name = f"ustack_{dead}_procs"
        path = os.path.join(tracefs_root(), "instances", name)
        try:
            os.mkdir(path)
            with open(os.path.join(path, "events", "sched", "sched_process_fork",
                                   "enable"), "w") as f:
                f.write("1")
        except FileNotFoundError:
            return False                # another run removed it at once
        try:
            remove_stale_tracing()
            return name not in ftrace_instance.instance_names()
        finally:
            ftrace_instance.remove_instance(name)
    assert any(one_call_clears() for _ in range(3))


def _lock_file(name: str) -> int:
    """A lock file for run `name`, as run_lock makes it; its fd."""
    os.makedirs(run_lock.LOCK_DIR, mode=0o700, exist_ok=True)
    return os.open(os.path.join(run_lock.LOCK_DIR, name),
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


# A run in another pid namespace is named ustack_<pid>_<namespace inode>;
# such names (unlike ustack_<pid>) are not touched by ustack versions that
# judged /proc, which may run on this machine at the same time.

def test_a_locked_name_stays_though_its_pid_is_gone_here():
    """What a run in another pid namespace sees: a name whose pid does not
    exist in its /proc, whose run holds its lock. It must stay."""
    name = f"ustack_{_dead_pid()}_1"
    event = _crashed_run(None, name)
    fd = _lock_file(name)
    fcntl.flock(fd, fcntl.LOCK_EX)                # the run is alive
    try:
        remove_stale_tracing()
        assert name in ftrace_instance.instance_names()
        assert event in defined_events()
    finally:
        os.unlink(os.path.join(run_lock.LOCK_DIR, name))
        os.close(fd)
        ftrace_instance.remove_instance(name)
        if event in defined_events():
            uprobe_events.remove_event(event)


def _one_call_clears_with_lock() -> bool:
    """Whether one call clears a fresh crashed run that left its lock file:
    its instance, its probe and the lock file."""
    name = f"ustack_{_dead_pid()}_1"
    os.close(_lock_file(name))                    # left by the killed run
    event = _crashed_run(None, name)
    try:
        remove_stale_tracing()
        return (name not in ftrace_instance.instance_names()
                and event not in defined_events()
                and not os.path.exists(os.path.join(run_lock.LOCK_DIR, name)))
    finally:
        ftrace_instance.remove_instance(name)
        if event in defined_events():
            uprobe_events.remove_event(event)
        if os.path.exists(os.path.join(run_lock.LOCK_DIR, name)):
            os.unlink(os.path.join(run_lock.LOCK_DIR, name))


def test_a_free_lock_proves_a_run_dead_and_goes_with_its_tracing():
    assert any(_one_call_clears_with_lock() for _ in range(3))
