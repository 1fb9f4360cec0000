"""kernel/leftovers.py against the real tracefs: what a SIGKILLed run left
(its instance with its uprobe enabled, which holds the probe busy) is
removed by the next run, instance first; a live run's probes stay."""
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
    """Leave what run `pid` leaves when killed mid-trace; its event name."""
    root = tracefs_root()
    group, name = f"ustack_{pid}", "p0_true"
    fd = os.open(os.path.join(root, "uprobe_events"), os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, f"p:{group}/{name} {os.path.realpath('/bin/true')}:0x0\n".encode())
    finally:
        os.close(fd)
    os.mkdir(os.path.join(root, "instances", group))
    with open(os.path.join(root, "instances", group, "events", group, name,
                           "enable"), "w") as f:
        f.write("1")
    return f"{group}/{name}"


def test_a_crashed_runs_instance_and_probes_are_removed():
    dead = _dead_pid()
    event = _crashed_run(dead)
    try:
        with pytest.raises(OSError):           # the enabled instance holds it
            uprobe_events.remove_event(event)
        assert remove_stale_tracing() >= 2
        assert f"ustack_{dead}" not in ftrace_instance.instance_names()
        assert event not in defined_events()
    finally:
        ftrace_instance.remove_instance(f"ustack_{dead}")
        if event in defined_events():
            uprobe_events.remove_event(event)


def test_a_live_runs_probes_stay_and_the_old_names_delegate():
    events = UprobeEvents()
    event = events.define(os.path.realpath("/bin/true"), 0, False, "live")
    dead = _dead_pid()
    stale = _crashed_run(dead)
    try:
        assert uprobe_events.remove_stale() >= 2    # the old name: everything stale
        assert stale not in defined_events()
        assert event in defined_events()
        _crashed_run(dead)
        assert ftrace_instance.remove_stale_instances() >= 2
        assert stale not in defined_events()
    finally:
        events.close()
        ftrace_instance.remove_instance(f"ustack_{dead}")
        if stale in defined_events():
            uprobe_events.remove_event(stale)
