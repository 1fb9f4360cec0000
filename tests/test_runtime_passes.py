"""The runtimes' passes of the in-kernel unwinder are loaded when the run
meets their runtime (capture/runtime_passes.py): a run that meets no
interpreter has the verifier check none of them, and the first object of
a runtime loads its pass before the walk can meet it."""
from __future__ import annotations

import os

import pytest

from helpers import DEBIAN_PYTHON
from ustack.capture.bpf_unwind import KernelUnwinder
from ustack.capture.unwind_objects import OBJ_KEY, OBJ_VALUE, object_keys
from ustack.capture.run_objects import RunObjects
from ustack.model import ProbeSpec, TracepointProbe
from ustack.unwind import tables

RUNTIMES = ("python", "js", "php", "perl", "ruby")


def _unwinder(owned: RunObjects, runtimes: bool) -> KernelUnwinder:
    """A trace's unwinder of syscall:write, its program loaded."""
    probe = TracepointProbe(ProbeSpec("syscall", "syscall:write"), "syscalls",
                            "sys_enter_write", "syscall:write")
    counter = KernelUnwinder([probe], owned, tables.for_image, stack_storage=16,
                             trace=True, ring_bytes=1 << 16,
                             **{name: runtimes for name in RUNTIMES})
    counter.load_programs()
    return counter


@pytest.fixture(scope="module")
def unwinders():
    owned = RunObjects()
    try:
        yield _unwinder(owned, True), _unwinder(owned, False)
    finally:
        owned.close()


def test_a_run_meeting_no_interpreter_verifies_no_pass(unwinders):
    with_runtimes, without = unwinders
    # none of the five passes in the walk's program: the verifier checks
    # about as many instructions as without them (with them: ~10 times
    # as many, 29,238 against 2,844)
    assert with_runtimes.verified[0] < 1.2 * without.verified[0]
    assert with_runtimes.passes.loaded == 0


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason=f"needs {DEBIAN_PYTHON}")
def test_the_first_object_of_a_runtime_loads_its_pass(unwinders):
    with_runtimes, _without = unwinders
    path = os.path.realpath(DEBIAN_PYTHON)
    with_runtimes.objects.add_path(path)
    with_runtimes.passes.settle()
    assert with_runtimes.passes.met == ["python"]
    assert with_runtimes.passes.failed == {}
    assert with_runtimes.passes.loaded == 2      # its walk's, and a deferred stack's
    # its entry, which makes a walk go on in the pass, written once it is in
    entry = with_runtimes.objects.maps.objects.lookup(OBJ_KEY.pack(*object_keys(path)[0]))
    assert entry is not None and OBJ_VALUE.unpack(entry)[6] == 1    # object_rows.python
