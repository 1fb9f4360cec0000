"""The capture contract (capture/contract.py): every backend and mode the
plan can choose gives a Capture, and a BPF run's kernel objects are owned,
counted by name and closed in one place (capture/run_objects.py)."""
from __future__ import annotations

import os

import pytest

from ustack.capture.backends import new_capture
from ustack.capture.bpf_counter import bpf_program_object
from ustack.capture.contract import Capture
from ustack.capture.run_objects import RunObjects
from ustack.model import ProfileProbe
from ustack.options import Options
from ustack.recording.reader import RecordedCapture
from ustack.target.process import Target
from ustack.unwind import tables

PROBES = [ProfileProbe(None, 99, "profile:hz:99")]


@pytest.mark.parametrize("backend,command,unwind_tables,kind", [
    ("perf", "count", None, "PerfCapture"),
    ("tracefs", "trace", None, "TracefsCapture"),
    ("bpf", "count", None, "StackCountCapture"),
    ("bpf", "count", tables.for_image, "UnwindCountCapture"),
    ("bpf", "trace", tables.for_image, "UnwindTraceCapture"),
    ("bpf", "offcpu", tables.for_image, "OffcpuCapture"),
    ("bpf", "funccount", None, "FuncCountCapture")])
def test_every_backend_and_mode_is_a_capture(backend, command, unwind_tables, kind):
    opts = Options(command=command)
    capture = new_capture(backend, PROBES, Target("system"), ("fp",), opts, unwind_tables)
    assert type(capture).__name__ == kind
    assert isinstance(capture, Capture)
    # stacks counted in the kernel: the stream alone is not the run's stacks
    assert capture.counts_in_kernel == (kind in ("StackCountCapture", "UnwindCountCapture",
                                                 "OffcpuCapture"))


def test_a_recording_is_a_capture():
    assert issubclass(RecordedCapture, Capture)


@pytest.mark.kernel
def test_error_counters_are_read_by_their_names_and_closed_with_the_run():
    obj = bpf_program_object("counts")
    owned = RunObjects()
    errors = owned.error_counters(owned.map(obj.make_map("errors")), obj.enum("count_error"))
    slots = obj.enum("count_error")
    errors.update(slots["ERR_STACKS_FULL"].to_bytes(4, "little"), (5).to_bytes(8, "little"))
    assert owned.errors() == {"ERR_COLLISION": 0, "ERR_STACKS_FULL": 5, "ERR_COUNTS_FULL": 0}
    fd = errors.fd
    owned.close()
    with pytest.raises(OSError):
        os.fstat(fd)
