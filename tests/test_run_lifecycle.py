"""A run's life and death seen from outside: a ustack run killed with
SIGKILL (any backend, -c or -p) leaves no probe, instance or command
behind (its guardian clears them), a -c command dies with the run even
when the guardian is killed too, and a ustack run in another pid
namespace never disturbs a live run (liveness is a lock, not /proc)."""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ustack.kernel.uprobe_events import remove_event

from helpers import (FP, build, finish, kill_run_and_guardian, ok, parse_counts,
                     popen_ustack, private_copy, run_ustack, spawn, start_ustack, stop, traced_pid, uprobe_hits, ustack_lines,
                     wait_tracing, wait_until, USTACK_PIDS)

TRACEFS = Path("/sys/kernel/tracing")
pytestmark = pytest.mark.kernel
BACKENDS = ["perf", "bpf", "tracefs"]


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=FP)


def instance(pid: int) -> Path:
    return TRACEFS / "instances" / f"ustack_{pid}"


def exited(pidfd: int) -> bool:
    """Whether the process of `pidfd` has ended (a pidfd polls readable)."""
    return bool(select.select([pidfd], [], [], 0)[0])


# --- a SIGKILLed run: its guardian removes what it made --------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkilled_run_of_a_command_leaves_nothing(chain, backend, tmp_path):
    prog = private_copy(chain, tmp_path)          # its uprobe hits are ours
    us = start_ustack("count", "--backend", backend, f"uprobe:{prog}:d",
                      "-c", f"{prog} {10 ** 12}")
    try:
        header = wait_tracing(us)
        command = os.pidfd_open(traced_pid(header))
        wait_until(lambda: uprobe_hits(prog) >= 100, what="100 hits of the probe on d")
        assert ustack_lines(us.pid)
        us.send_signal(signal.SIGKILL)
        us.wait()
    finally:
        stop(us)
    try:
        wait_until(lambda: exited(command), timeout=5, what="the end of the -c command")
    finally:
        os.close(command)
    wait_until(lambda: not ustack_lines(us.pid) and not instance(us.pid).exists(),
               timeout=5, what="the removal of the killed run's probes and instance")
    assert uprobe_hits(prog) == 0                 # no uprobe left on the file at all


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_command_ends_when_the_run_and_its_guardian_are_both_killed(chain, backend,
                                                                     tmp_path):
    """Nobody is left to end the -c command (the OOM killer, or a kill of
    both): it must not run on untraced. It says it runs by writing its pid."""
    alive = tmp_path / "alive"
    us = start_ustack("count", "--backend", backend, f"uprobe:{chain}:d",
                      "-c", f"sh -c 'echo $$ > {alive}.new && mv {alive}.new {alive} "
                            f"&& exec sleep 1000'")
    command = None
    try:
        wait_tracing(us)
        wait_until(alive.exists, timeout=20, what="the -c command saying it runs")
        command = os.pidfd_open(int(alive.read_text()))
        kill_run_and_guardian(us)
        us.wait()
        wait_until(lambda: exited(command), timeout=5,
                   what="the end of the -c command of a run killed with its guardian")
        # what the killed pair made is the next run's to remove
        ok(run_ustack("count", "--backend", "perf", f"uprobe:{chain}:d", "-c", f"{chain} 1"))
    finally:
        stop(us)
        if command is not None:
            if not exited(command):
                signal.pidfd_send_signal(command, signal.SIGKILL)
            os.close(command)


def closers_of_this_test() -> list:
    """ustack's detached closers (capture/closer.py) that this test's runs
    started (they carry the test's tag in their environment)."""
    from ustack.capture.closer import NAME
    tag = f"USTACK_TEST_TAG={os.environ['USTACK_TEST_TAG']}".encode()
    found = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            if ((d / "comm").read_text().strip() == NAME
                    and tag in (d / "environ").read_bytes().split(b"\0")):
                found.append(int(d.name))
        except OSError:
            pass
    return found


def group_lines(pattern: str) -> list:
    """uprobe_events lines of the groups that fully match `pattern`."""
    return [line for line in (TRACEFS / "uprobe_events").read_text().splitlines()
            if re.match(rf"^[pr]:{pattern}/", line)]


def test_a_killed_closer_leaves_no_probe():
    """A run of 6 perf-event uprobes leaves their closing to a closer (the
    kernel waits ~0.15 s for each): killed mid-work, what it had not
    removed is removed by the run's guardian as soon as the kernel lets go
    of it, not left for a later run. The run is in a pid namespace of its own
    (its probes named ustack_PID_NS, kept by a shell there): no other
    ustack run on this machine judges them dead meanwhile."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    for attempt in range(5):
        if closer_killed_mid_work():
            break
    else:
        pytest.fail("every closer had finished before the test could kill it")


def closer_killed_mid_work() -> bool:
    """One run as the test above says; False (nothing killed) when its
    closer was done before it could be killed."""
    libc = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")
    script = '"$0" -m ustack "$@" >/dev/null; echo ended $?; read line'
    us = popen_ustack("count", "--backend", "perf", f"uprobe:{libc}:fputw*", "-c", "true",
                      cmd=("unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script,
                           sys.executable),
                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    group = None
    try:
        children = f"/proc/{us.pid}/task/{us.pid}/children"
        wait_until(lambda: open(children).read().split(), what="the namespace's shell")
        shell = int(open(children).read().split()[0])
        group = rf"ustack_\d+_{os.stat(f'/proc/{shell}/ns/pid').st_ino}"
        assert us.stdout.readline() == "ended 0\n", us.communicate()[1]
        # the closer names itself as it starts (the run may have ended first)
        wait_until(lambda: closers_of_this_test() or not group_lines(group),
                   what="the closer")
        closers = closers_of_this_test()
        if not group_lines(group):
            wait_until(lambda: not closers_of_this_test(), what="the closer's end")
            return False
        for pid in closers:
            os.kill(pid, signal.SIGKILL)
        # the kernel tears down the dead closer's events first (~0.1-0.5 s
        # each, one at a time): the bound is the kernel's, not ustack's
        wait_until(lambda: not group_lines(group), timeout=30,
                   what="the removal of a killed closer's probes")
        return True
    finally:
        if us.poll() is None:
            us.stdin.write("\n")        # the namespace's shell ends
            us.stdin.flush()
        finish(us)
        for line in group_lines(group) if group else ():     # (a failed test's)
            remove_event(line.split()[0][2:])


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigkilled_run_on_a_pid_leaves_nothing_and_the_process_runs(chain, backend,
                                                                     tmp_path):
    prog = private_copy(chain, tmp_path)
    target = spawn(prog, 10 ** 12)
    try:
        us = start_ustack("count", "--backend", backend, f"uprobe:{prog}:d",
                          "-p", target.pid)
        try:
            wait_tracing(us)
            wait_until(lambda: uprobe_hits(prog) >= 100,
                       what="100 hits of the probe on d")
            us.send_signal(signal.SIGKILL)
            us.wait()
        finally:
            stop(us)
        wait_until(lambda: not ustack_lines(us.pid) and not instance(us.pid).exists(),
                   timeout=5, what="the removal of the killed run's probes and instance")
        assert uprobe_hits(prog) == 0
        assert target.poll() is None, "the -p process must go on running"
    finally:
        stop(target)


def test_a_bystander_mapping_the_file_runs_untraced_after_a_sigkill(chain, tmp_path):
    """tracefs uprobes fire in every process that maps the file: after the
    kill, a new process of the same file hits no probe."""
    prog = private_copy(chain, tmp_path)
    us = start_ustack("count", "--backend", "tracefs", f"uprobe:{prog}:d",
                      "-c", f"{prog} {10 ** 12}")
    try:
        wait_tracing(us)
        wait_until(lambda: uprobe_hits(prog) >= 100, what="100 hits of the probe on d")
        us.send_signal(signal.SIGKILL)
        us.wait()
    finally:
        stop(us)
    wait_until(lambda: not ustack_lines(us.pid), timeout=5,
               what="the removal of the killed run's probes")
    subprocess.run([str(prog), "100000"], check=True, timeout=60)
    assert uprobe_hits(prog) == 0
    assert not instance(us.pid).exists()


# --- another pid namespace ------------------------------------------------------

@pytest.mark.alone      # its exact count (or lost count) of 2,000 hits through tracefs
def test_a_run_in_another_pid_namespace_leaves_a_live_run_alone(tmp_path):
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    threads = private_copy(build("threads", flags=FP), tmp_path)
    per_thread = 1000                             # 2 threads call thread_d this often
    # a buffer that holds all 2,000 hits unread: tracefs's lost count also
    # counts the fork records it lost, which would break the sum below
    live = popen_ustack("count", "--backend", "tracefs", "--buffer-pages", "4096",
                        f"uprobe:{threads}:thread_d",
                        "-c", f"{threads} - {per_thread}", stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_tracing(live)
        probes = ustack_lines(live.pid)
        assert len(probes) == 1 and instance(live.pid).is_dir()
        event = probes[0].split()[0].partition(":")[2]          # group/name
        enabled = instance(live.pid) / "events" / event / "enable"
        wait_until(lambda: enabled.read_text().strip() == "1",
                   what="the live run's event switched on")
        # a second run, in its own pid namespace (where the first run's pid
        # does not exist), cleans up before it sets up (as every backend
        # does; tracefs cannot follow a pid of another namespace)
        chain = build("chain", flags=FP)
        other = popen_ustack("count", "--backend", "perf", f"uprobe:{chain}:d",
                             "-c", f"{chain} 3", stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             cmd=("unshare", "--pid", "--fork", "--mount-proc",
                                  sys.executable, "-m", "ustack"))
        out, err = finish(other)
        assert other.returncode == 0, err
        assert [c["count"] for c in parse_counts(out)] == [3]
        assert ustack_lines(live.pid) == probes
        assert enabled.read_text().strip() == "1", "the live run's event was switched off"
        live.stdin.write("go\n")                  # the traced command starts
        live.stdin.flush()
        out, err = finish(live)
    finally:
        stop(live)
    assert live.returncode == 0, err
    # every call counted, or counted as lost (a loaded machine may overrun
    # the buffer: that is said, not silent)
    lost = re.search(r"Lost (\d+) events", err)
    counted = sum(c["count"] for c in parse_counts(out))
    assert counted + (int(lost.group(1)) if lost else 0) == 2 * per_thread, err
    assert counted > per_thread
