"""kernel/leftovers.py against the real tracefs: what a SIGKILLed run left
(its instance with its uprobe enabled, which holds the probe busy) is
removed by the next run, instance first; a live run's probes stay.

Other ustack runs on this machine remove stale leftovers too, at any
moment, and two removals at once can both be refused (EBUSY): so each
check gets three fresh crashed runs, of which one call must clear one.
A probe-first order would clear none (the instance holds the probe)."""
from __future__ import annotations

import os

import pytest

from ustack.kernel import ftrace_instance, uprobe_events
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


def _crashed_run(pid: int) -> str:
    """Leave what run `pid` leaves when killed mid-trace; its event name.
    Another ustack run may remove the half-made leftovers at once: retry."""
    for _ in range(20):
        try:
            return _leave_tracing(pid)
        except FileNotFoundError:
            ftrace_instance.remove_instance(f"ustack_{pid}")
    raise AssertionError("other ustack runs kept removing the test's leftovers")


def _leave_tracing(pid: int) -> str:
    root = tracefs_root()
    group, name = f"ustack_{pid}", "p0_true"
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
