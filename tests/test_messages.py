"""Errors that say what is wrong, through the real command: one line on
stderr, status 1, no traceback."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import build, ok, run_ustack, spawn, stop, wait_until


def one_error(res) -> str:
    assert res.returncode == 1, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ustack: "), res.stderr
    return lines[0]


@pytest.mark.kernel
def test_pid_whose_files_are_denied():
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not installed")
    res = run_ustack("count", "uprobe:libc:malloc", "-p", "1", "-d", "1",
                     cmd=("unshare", "--user", "--map-root-user", sys.executable,
                          "-m", "ustack"))
    assert one_error(res) == (
        "ustack: cannot read the files of PID 1 (/proc/1/root: permission denied): "
        "ustack may not look into that process from here (a user namespace of its "
        "own, or ptrace restrictions)")


@pytest.mark.kernel
def test_zombie_pid():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        wait_until(lambda: open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
                   == "Z", what="the child becoming a zombie")
        res = run_ustack("count", "syscall:write", "-p", pid, "-d", "1")
        assert one_error(res) == (
            f"ustack: PID {pid} is a zombie: it has exited and its parent has not "
            "reaped it yet; there is nothing left to trace")
    finally:
        os.waitpid(pid, 0)


@pytest.mark.kernel
def test_pid_with_leading_zeros_is_decimal_as_for_perf():
    prog = build("chain")
    target = spawn(prog, 10 ** 12)
    try:
        res = ok(run_ustack("count", f"uprobe:{prog}:d", "-p", f"00{target.pid}",
                            "-d", "0.5"))
        assert f" in PID {target.pid} " in res.stderr.splitlines()[0], res.stderr
    finally:
        stop(target)


@pytest.mark.parametrize("pids, why", [
    ("1,,2", "an empty id in '1,,2'"), ("1,", "an empty id in '1,'"),
    ("1,+2", "not a decimal id: '+2' in '1,+2'"), ("0x10", "not a decimal id: '0x10' in '0x10'"),
])
def test_pid_lists_refused(pids, why):
    res = run_ustack("count", "syscall:write", "-p", pids)
    assert one_error(res) == (f"ustack: argument -p/--pid: {why} "
                              "(see `ustack count --help`)")


@pytest.mark.kernel
def test_frequency_above_the_kernel_limit():
    with open("/proc/sys/kernel/perf_event_max_sample_rate") as f:
        limit = int(f.read())
    hz = limit * 10
    for args in (("profile", "-F", hz, "-d", "1"), ("record", "-F", hz, "-d", "1")):
        res = run_ustack(*args)
        assert one_error(res) == (
            f"ustack: -F {hz} is above the kernel's limit of {limit} samples/s "
            "(/proc/sys/kernel/perf_event_max_sample_rate): lower -F, or raise the "
            f"limit with `sysctl kernel.perf_event_max_sample_rate={hz}`"), args
