"""The target programs themselves: they build in every variant, exit 0 on
their own, and gdb (the oracle) sees the call chains other tests expect."""
from __future__ import annotations

import os
import subprocess

import pytest

from helpers import VARIANTS, build, build_go, gdb_backtrace


def run(*cmd, timeout=30):
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", [[], ["write"], ["rawwrite"]])
def test_chain_runs(variant, mode):
    prog = build("chain", **VARIANTS[variant])
    assert run(prog, 1000, *mode).stdout == ""  # writes go to /dev/null


@pytest.mark.parametrize("variant", VARIANTS)
def test_chain_stack(variant):
    prog = build("chain", **VARIANTS[variant])
    assert gdb_backtrace(prog, [1], "d") == ["d", "c", "b", "a", "main"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_busy(variant):
    """busy SECONDS spins for SECONDS of its own CPU time (the kernel's
    account of the child, however loaded the machine), in spin_here."""
    prog = build("busy", **VARIANTS[variant])
    proc = subprocess.Popen([str(prog), "0.3"])
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0
    assert usage.ru_utime + usage.ru_stime >= 0.3, usage
    assert gdb_backtrace(prog, [0.1], "spin_here") == ["spin_here", "work", "main"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_threads(variant):
    prog = build("threads", **VARIANTS[variant])
    run(prog, 0, 5)  # exit status 3 would mean thread_d ran a wrong number of times
    # Below worker come libc's thread-start frames, which vary by version.
    assert gdb_backtrace(prog, [0, 5], "thread_d")[:3] == ["thread_d", "thread_a", "worker"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_dlopen(variant):
    prog = build("dlopen_main", **VARIANTS[variant])
    plugin = build("plugin", flags=VARIANTS[variant]["flags"], kind="shared")
    run(prog, 0, plugin, 3)
    assert gdb_backtrace(prog, [0, plugin, 3], "plugin_leaf") == \
        ["plugin_leaf", "plugin_entry", "run_plugin", "main"]


def test_dlopen_default_plugin_path(tmp_path):
    """Without PLUGIN, dlopen_main loads plugin.so beside itself."""
    prog = tmp_path / "dlopen_main"
    prog.write_bytes(build("dlopen_main").read_bytes())
    prog.chmod(0o755)
    (tmp_path / "plugin.so").write_bytes(build("plugin", kind="shared").read_bytes())
    run(prog, 0)


@pytest.mark.parametrize("strip", [False, True], ids=["symbols", "stripped"])
@pytest.mark.parametrize("mode", [[], ["write"]])
def test_gochain_runs(strip, mode):
    run(build_go("gochain", strip=strip), 3, *mode)  # exit 3: d ran a wrong number of times


def test_gochain_stack():
    stack = gdb_backtrace(build_go("gochain"), [3], "main.d")
    assert stack == ["main.d", "main.(*T).c", "main.b", "main.a", "main.main"]


@pytest.mark.parametrize("name", ["threads", "dlopen_main"])
def test_wait_for_a_line_on_stdin(name):
    """With "-" the program works only once a line arrives on stdin (how -p
    tests release a target after ustack is attached); at EOF it exits 4."""
    prog = build(name)
    args = [prog, "-", *([build("plugin", kind="shared"), 3] if name == "dlopen_main"
                         else [5])]
    res = subprocess.run([str(a) for a in args], input="go\n", capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert subprocess.run([str(a) for a in args], stdin=subprocess.DEVNULL,
                          timeout=30).returncode == 4
