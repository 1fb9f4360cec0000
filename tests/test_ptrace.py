"""kernel.ptrace through a traced command (-c under the tracefs backend):
held at its first instruction, stopped again at its exit while its maps
still exist, and its exit status passed on."""
from __future__ import annotations

import os
import shutil

import pytest

from ustack.kernel import ptrace
from ustack.kernel.procfs import executable_mappings
from ustack.target.traced_command import launch_traced


def test_traced_command_stops_at_exit_with_its_maps():
    seen = {}
    target = launch_traced("sh -c 'exit 3'")
    target.on_exit = lambda pid, execs: seen.setdefault(pid, (execs, executable_mappings(pid)))
    target.release()
    # stands at its first instruction: already the shell, not yet running
    assert os.readlink(f"/proc/{target.pid}/exe") == os.path.realpath(shutil.which("sh"))
    target.resume()
    target.wait(block=True)
    assert target.exit_status == 3
    execs, maps = seen[target.pid]
    assert maps                                               # maps at the exit stop
    assert execs == 0                   # no exec after the one it stood at first


def test_the_exit_stop_counts_the_execs_after_the_first():
    """sh execs sleep: one exec after the held first one; the exit stop
    says so, and gives sleep's maps, not the shell's."""
    seen = {}
    target = launch_traced("sh -c 'exec sleep 0'")
    target.on_exit = lambda pid, execs: seen.setdefault(pid, (execs, executable_mappings(pid)))
    target.release()
    target.resume()
    target.wait(block=True)
    execs, maps = seen[target.pid]
    assert execs == 1
    assert os.path.basename(maps[0].path) == "sleep", maps


def test_ptrace_errors_carry_the_errno():
    with pytest.raises(ProcessLookupError):
        ptrace.cont(os.getpid())          # not our tracee: ESRCH


@pytest.mark.kernel
def test_a_command_held_at_its_exec_stop_is_ended_not_waited_for():
    """Set-up failing after the command was released to its exec stop
    (tracefs refusing an event) must not leave ustack in waitpid for ever."""
    from ustack.target.traced_command import launch_traced
    target = launch_traced("sleep 30")
    target.release()                      # now stopped at its first instruction
    target.finish(grace=5)                # what Session.close does
    assert target.exit_status == -9 and target.interrupted
