"""System-wide runs: the idle task and kernel threads have no
user stack and are labelled [idle] and [kernel]; --include-idle keeps the
idle task's samples, which are left out by default; ustack's own process
never appears."""
from __future__ import annotations

import subprocess

import pytest

from helpers import (build, finish, funcs, parse_counts, parse_folded, start_ustack, stop,
                     wait_tracing)
from ustack.model import RawSample
from ustack.symbols.stacks import IDLE, KERNEL_THREAD, StackResolver
from ustack.target.mappings import MappingTracker


def _empty_sample(pid: int) -> RawSample:
    return RawSample(probe=0, pid=pid, tid=pid, time_ns=0, cpu=0)


def test_idle_and_kernel_thread_stacks_are_labelled():
    resolver = StackResolver(MappingTracker())
    assert resolver.stack(_empty_sample(0)).frames == (IDLE,)
    assert resolver.stack(_empty_sample(2)).frames == (KERNEL_THREAD,)   # kthreadd
    assert IDLE.function == "[idle]" and KERNEL_THREAD.function == "[kernel]"


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "bpf"])
def test_system_wide_profile_with_idle(tmp_path, backend):
    """--include-idle: idle samples (if this shared machine idled at all
    during the run) show as `swapper-0;[idle]`; ustack itself is still left
    out; the workload's stacks are there."""
    busy = tmp_path / "idlebusy"
    busy.write_bytes(build("busy").read_bytes())
    busy.chmod(0o755)
    us = start_ustack("profile", "-F", "99", "-d", "2", "-P", "-f", "folded",
                      "--include-idle", "--backend", backend, stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        assert subprocess.run([str(busy), "0.3"], timeout=30).returncode == 0
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    rows = parse_folded(out)
    pids = {int(stack[0].rpartition("-")[2]) for stack, _n in rows}
    assert us.pid not in pids, out
    idle = [stack for stack, _n in rows if stack[0].endswith("-0")]
    print(f"idle samples: {len(idle)} stacks")
    assert all(stack == ["swapper-0", "[idle]"] for stack in idle), out
    assert any(stack[0].startswith("idlebusy-") and "spin_here" in stack
               for stack, _n in rows), out


@pytest.mark.kernel
def test_system_wide_count_of_writes_leaves_out_ustack(tmp_path):
    """`count -P syscall:write` over the whole machine: ustack writes (its
    status, its report) yet none of its writes is counted; the workload's
    3 writes are, with their whole stack. Counted in the kernel (bpf): other
    processes' writes cannot crowd ours out of a ring buffer."""
    writer = tmp_path / "cwriter"
    writer.write_bytes(build("chain").read_bytes())
    writer.chmod(0o755)
    us = start_ustack("count", "-P", "syscall:write", "-d", "2", "--backend", "bpf",
                      stdout=subprocess.PIPE)
    try:
        wait_tracing(us, timeout=60)
        proc = subprocess.Popen([str(writer), "3", "write"], stdout=subprocess.DEVNULL)
        assert proc.wait(timeout=30) == 0
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    stacks = parse_counts(out)
    assert not [s for s in stacks if s["pid"] == us.pid], out
    mine = [s for s in stacks if s["pid"] == proc.pid]
    assert all(funcs(s["frames"])[:5] == ["write", "d", "c", "b", "a"] for s in mine), out
    assert sum(s["count"] for s in mine) == 3, out + err
