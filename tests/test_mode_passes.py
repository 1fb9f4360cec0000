"""offcpu's, latency's and memleak's programs reach the runtimes' passes as
the unwinder's do (capture/runtime_passes.py, bpf/passes.h): a run that
meets no interpreter has the verifier check none of the five passes in
their walk's programs, and the first object of a runtime loads its pass,
for each kind of program that walks."""
from __future__ import annotations

import os

import pytest

from helpers import DEBIAN_PYTHON
from ustack.capture.bpf_latency import LatencyCounter, Site as LatencySite
from ustack.capture.bpf_memleak import MemleakCounter, Site as MemleakSite
from ustack.capture.bpf_offcpu import OffcpuCounter, OffcpuFilter
from ustack.capture.run_objects import RunObjects
from ustack.kernel.bpf_syscall import verified_insns
from ustack.model import ProbeSpec, TracepointProbe, UprobeProbe
from ustack.unwind import tables

RUNTIMES = ("python", "js", "php", "perl", "ruby")
LIBC = os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")


def _tracepoint(group: str, name: str) -> TracepointProbe:
    return TracepointProbe(ProbeSpec("tracepoint", f"tracepoint:{group}:{name}"), group, name,
                           f"tracepoint:{group}:{name}")


def _offcpu(owned: RunObjects, runtimes: bool) -> OffcpuCounter:
    """sched_switch's and sched_waking's programs (--wakers)."""
    return OffcpuCounter([_tracepoint("sched", "sched_switch"),
                          _tracepoint("sched", "sched_waking")], owned, tables.for_image,
                         filter_=OffcpuFilter(wakers=True), stack_storage=16,
                         **{name: runtimes for name in RUNTIMES})


def _latency(owned: RunObjects, runtimes: bool) -> LatencyCounter:
    """latency --by-stack of syscall:nanosleep: its entry walks."""
    probes = [_tracepoint("syscalls", "sys_enter_clock_nanosleep"),
              _tracepoint("syscalls", "sys_exit_clock_nanosleep")]
    return LatencyCounter(probes, owned, [LatencySite(0, "entry"), LatencySite(0, "return")],
                          unit_ns=1000, by_stack=True, slower_ns=None,
                          tables=tables.for_image, stack_storage=16,
                          **{name: runtimes for name in RUNTIMES})


def _memleak(owned: RunObjects, runtimes: bool) -> MemleakCounter:
    """memleak's malloc entry (the probe's place matters not: never attached)."""
    probe = UprobeProbe(ProbeSpec("uprobe", f"uprobe:{LIBC}:malloc"), LIBC, 0, 0, "malloc", 0,
                        None, "uprobe:libc:malloc")
    return MemleakCounter([probe], owned, [MemleakSite("entry", "ML_MALLOC")],
                          tables.for_image, stack_storage=16,
                          **{name: runtimes for name in RUNTIMES})


MODES = {"offcpu": _offcpu, "latency": _latency, "memleak": _memleak}


@pytest.fixture(scope="module")
def counters():
    owned = RunObjects()
    try:
        made = {}
        for mode, make in MODES.items():
            pair = make(owned, True), make(owned, False)
            for counter in pair:
                counter.load_programs()
            made[mode] = pair
        yield made
    finally:
        owned.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_run_meeting_no_interpreter_verifies_no_pass(counters, mode):
    with_runtimes, without = counters[mode]
    walking = [i for i, fd in with_runtimes.loaded.items()
               if verified_insns(without.loaded[i]) > 1000]
    assert walking, "no program of the mode walks stacks"
    for i in walking:
        # inline, the five passes made each walk's program verify ~10x
        # the instructions of the walk alone
        assert verified_insns(with_runtimes.loaded[i]) < 1.2 * verified_insns(
            without.loaded[i]), (mode, i)
    assert with_runtimes.passes.loaded == 0


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason=f"needs {DEBIAN_PYTHON}")
@pytest.mark.parametrize("mode, kinds", [("offcpu", 2), ("latency", 1), ("memleak", 1)])
def test_the_first_object_of_a_runtime_loads_its_pass(counters, mode, kinds):
    with_runtimes, _without = counters[mode]
    with_runtimes.objects.add_path(os.path.realpath(DEBIAN_PYTHON))
    with_runtimes.passes.settle()
    assert with_runtimes.passes.met == ["python"]
    assert with_runtimes.passes.failed == {}
    # the Python pass, once per kind of walk program (offcpu: sched_switch's
    # raw tracepoint and sched_waking's tracepoint)
    assert with_runtimes.passes.loaded == kinds
