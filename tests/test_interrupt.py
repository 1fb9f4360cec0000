"""Ctrl-C and SIGTERM end a run at once whatever it is doing: while it
opens thousands of probes (set-up gives up, the held -c command never
runs, what was opened is removed), and while a high-rate trace has a
backlog to decode (the backlog is dropped and counted). The 30 s guards
only keep a hung run from hanging the suite; the runs end in well under
a second (see the commit that made them so for the measured times)."""
from __future__ import annotations

import os
import re
import select
import signal

import pytest

from helpers import (build, finish, private_copy, start_ustack, stop, uprobe_hits,
                     ustack_lines, wait_tracing, wait_until)

# ~1,800 functions of libc (globs without IFUNCs): set-up takes tens of seconds
LIBC_GLOBS = [f"uprobe:libc:{c}*" for c in "psfxcilrweamnouvbdhkqy"]


def uprobe_links_of(pid: int) -> list:
    """The uprobe_multi links process `pid` holds (its fds' fdinfo)."""
    found = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    if "link_type:\tuprobe_multi" in f.read():
                        found.append(fd)
            except OSError:
                pass
    except OSError:
        pass
    return found


@pytest.mark.kernel
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
@pytest.mark.parametrize("backend", ["auto", "perf"])
def test_signal_during_setup_ends_the_run_unstarted(backend, sig, tmp_path):
    # set-up is under way once the run's first probes are defined (perf)
    # or its first uprobe_multi link is made (bpf: ~8 links of 256, made
    # in well under a second: a run may be set up before the test looks)
    started = ustack_lines if backend == "perf" else uprobe_links_of
    for attempt in range(10):
        ran = tmp_path / f"ran{attempt}"
        us = start_ustack("count", *LIBC_GLOBS, "--backend", backend, "-c", f"touch {ran}")
        try:
            wait_until(lambda: started(us.pid) or us.poll() is not None,
                       timeout=60, what="the run's first uprobes")
            signalled = signalled_in_setup(us, sig)
        except BaseException:
            stop(us)
            raise
        if signalled:
            break
        try:
            finish(us, timeout=60)       # set up already: this attempt does not count
        finally:
            stop(us)
    else:
        pytest.fail("every run was set up before the test could signal it")
    try:
        err = finish(us, timeout=30)[1]
        assert us.returncode == 130, err
        assert err.splitlines() == ["ustack: interrupted while setting up: nothing was "
                                    "traced"], err
        assert not ran.exists(), "the -c command ran"
        # a detached process closes what was opened (the kernel waits ~0.1 s
        # a probe) and removes the probe definitions last
        wait_until(lambda: not ustack_lines(us.pid), timeout=300,
                   what="the interrupted run's probes being removed")
    finally:
        stop(us)


def signalled_in_setup(us, sig) -> bool:
    """Send `sig` to the ustack run `us` if it is still setting up: stopped
    first, it is when it has printed nothing (its header comes before the
    -c command is let go), and then the signal is handled before it goes
    on. False (nothing sent) when it was too late."""
    os.kill(us.pid, signal.SIGSTOP)
    try:
        setting_up = us.poll() is None and not select.select([us.stderr], [], [], 0)[0]
        if setting_up:
            us.send_signal(sig)
        return setting_up
    finally:
        if us.poll() is None:
            os.kill(us.pid, signal.SIGCONT)


@pytest.mark.kernel
@pytest.mark.parametrize("ending", ["SIGINT", "-d"])
@pytest.mark.parametrize("backend", ["perf", "bpf"])
def test_signal_at_a_high_rate_drops_the_backlog(backend, ending, tmp_path):
    """A probe in a tight loop fires faster than stacks are printed: a
    backlog builds up. SIGINT, or the end of -d, leaves a fraction of a
    second to what was sent, drops the rest, says how many events that
    was, and ends the command."""
    prog = private_copy(build("chain"), tmp_path)
    # perf: frame pointers, cheap per event in the kernel, slow to print
    fp = ["--unwind", "fp"] if backend == "perf" else []
    duration = ["-d", "3"] if ending == "-d" else []
    us = start_ustack("trace", f"uprobe:{prog}:d", "--backend", backend, *fp, *duration,
                      "-c", f"{prog} {10 ** 12}")
    try:
        wait_tracing(us)
        if ending == "SIGINT":
            wait_until(lambda: uprobe_hits(prog) >= 1_000_000, timeout=120,
                       what="1,000,000 hits of d")
            us.send_signal(signal.SIGINT)
        err = finish(us, timeout=30)[1]
        assert us.returncode == 0, err
        assert "Traceback" not in err, err
        assert f"{prog} (PID " in err and err.rstrip().endswith("was ended with the run"), err
        # what did not reach the output is said in one line of each kind (the
        # reader may have kept up, or emptied its backlog within the grace time)
        lost = [line for line in err.splitlines() if line.startswith("Lost ")]
        assert len(lost) <= 1 and all(re.fullmatch(
            r"Lost [1-9]\d* events: the \w+ buffer was full \(try --buffer-pages \d+\)",
            line) for line in lost), err
        dropped = [line for line in err.splitlines() if "dropped unread" in line]
        assert len(dropped) <= 1 and all(re.fullmatch(
            r"[1-9]\d* events were dropped unread: the run was asked to end while they "
            r"waited to be read", line) for line in dropped), err
        assert ustack_lines(us.pid) == []
    finally:
        stop(us)
