"""Events the kernel skipped ustack's programs for are counted and said.

Behind a classic tracepoint the kernel runs BPF programs through
trace_call_bpf, which runs none while another BPF program (or a bpf()
call) is under way on the CPU, and counts each such skip in the program's
recursion_misses. The test makes that happen on purpose: a BPF program of
its own, on the target's syscalls:sys_enter_write, sends the target a
SIGURG (ignored by default) with bpf_send_signal, and so fires
signal:signal_generate from inside a BPF program. `ustack count
tracepoint:signal:signal_generate -p TARGET` then misses the 50 of them
that the target's 50 writes cause, and must say so."""
from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest

from helpers import build, run_attached, stop

from ustack.kernel import bpf_syscall
from ustack.kernel import perf_event as pe
from ustack.kernel.tracefs import tracepoint_id

pytestmark = pytest.mark.kernel

SEND_SIGNAL = 109                       # the helper bpf_send_signal(sig)


def signalling_program(pid: int) -> int:
    """SIGURG to the current process if it is `pid` (a program on a
    tracepoint runs for every task that hits it)."""
    b = bpf_syscall
    code = (b.call(b.GET_CURRENT_PID_TGID) + b.alu_imm(b.RSH, 0, 32) +
            b.jmp_imm(b.JNE, 0, pid, 2) +
            b.mov_imm(1, int(signal.SIGURG)) + b.call(SEND_SIGNAL) +
            b.mov_imm(0, 0) + b.exit_())
    return b.load_program(b.PROG_TRACEPOINT, code, "test_sigurg")


def test_events_skipped_by_the_kernel_are_counted_and_said():
    chain = build("chain")
    target = subprocess.Popen(["sh", "-c", f"read x; exec {chain} 50 write"],
                              stdin=subprocess.PIPE)
    prog = signalling_program(target.pid)
    writes = pe.open_event(pe.make_attr(pe.TYPE_TRACEPOINT,
                                        tracepoint_id("syscalls", "sys_enter_write")),
                           target.pid, -1, what="the test's tracepoint")
    try:
        bpf_syscall.attach(writes, prog)
        r = run_attached(target, "count", "tracepoint:signal:signal_generate")
    finally:
        os.close(writes)
        os.close(prog)
        stop(target)
    assert r.returncode == 0, r.stderr
    missed = re.search(r"^(\d+) events were missed: the kernel ran no program of "
                       r"ustack's for them, another BPF program \(or a bpf\(\) call\) "
                       r"being under way on that CPU$", r.stderr, re.M)
    assert missed, r.stderr
    assert int(missed.group(1)) == 50
