"""Instructions the kernel's x86 uprobes refuse (lock and segment prefixes):
refused before the run with the next instruction suggested, on every
backend and target kind (with -c the kernel's refusal is silent: the run
used to count 0); a glob skips them with a note. And a -c command held at
its exec stop when set-up fails is ended, not waited for for ever."""
from __future__ import annotations

import subprocess

import pytest

from helpers import run_ustack

pytestmark = pytest.mark.kernel

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


def lock_prefixed_entry() -> bool:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", LIBC],
                         capture_output=True, text=True).stdout
    at = out.find("<pthread_spin_lock@@GLIBC_2.34>:\n")
    return at >= 0 and out[at:].splitlines()[1].split(":", 1)[1].strip().startswith("lock")


@pytest.fixture(scope="module", autouse=True)
def debian_libc():
    if not lock_prefixed_entry():
        pytest.skip("this libc's pthread_spin_lock does not start with a lock prefix")


@pytest.mark.parametrize("backend", ["perf", "bpf", "tracefs"])
def test_a_lock_prefixed_entry_is_refused_before_the_run(backend):
    command = "trace" if backend != "bpf" else "count"
    res = run_ustack(command, "uprobe:libc:pthread_spin_lock", "-c", "true",
                     "--backend", backend, timeout=60)
    assert res.returncode == 1
    assert res.stderr == (
        f"ustack: the kernel cannot place a uprobe at pthread_spin_lock in {LIBC}: "
        "'lock dec dword ptr [rdi]' has a lock prefix, which x86 uprobes refuse; "
        "probe the next instruction, pthread_spin_lock+0x3\n")


def test_the_next_instruction_is_accepted():
    res = run_ustack("count", "uprobe:libc:pthread_spin_lock+0x3", "-c", "true")
    assert res.returncode == 0, res.stderr


def test_a_glob_skips_what_cannot_be_probed_with_a_note():
    res = run_ustack("count", "uprobe:libc:pthread_spin_*lock", "-c", "true")
    assert res.returncode == 0, res.stderr
    assert "pthread_spin_unlock" in res.stderr.splitlines()[0]    # the header
    assert (f"ustack: skipped: the kernel cannot place a uprobe at pthread_spin_lock "
            f"in {LIBC}") in res.stderr


@pytest.mark.parametrize("command", ["funccount", "count"])
def test_a_glob_skips_an_ifunc_resolved_outside_the_library(command):
    """libc's time and gettimeofday are IFUNCs that resolve to the vDSO:
    nothing in libc to probe; a glob over them goes on without them."""
    event = "libc:tim*" if command == "funccount" else "uprobe:libc:tim*"
    res = run_ustack(command, event, "-c", "true")
    assert res.returncode == 0, res.stderr
    assert "timer_create" in res.stderr.splitlines()[0]
    assert (f"ustack: skipped: time in {LIBC} is an IFUNC whose code is not in "
            f"{LIBC} here (the vDSO's, or chosen where ustack cannot see)") \
        in res.stderr.splitlines()
