"""kernel/uprobe_events.py against the real tracefs: the kernel's refusals
are explained, and removing probes that are already gone is quiet."""
from __future__ import annotations

import os

import pytest

from ustack.kernel import uprobe_events
from ustack.kernel.uprobe_events import UprobeEvents
from ustack.model import UstackError

pytestmark = pytest.mark.kernel


def test_missing_file_is_the_kernels_reason_not_missing_uprobe_support(tmp_path):
    # resolve.py finds missing files first; a file deleted between resolving
    # and defining reaches the kernel, whose ENOENT must not read as
    # "this kernel has no uprobe support"
    events = UprobeEvents()
    gone = str(tmp_path / "gone")
    with pytest.raises(UstackError) as e:
        events.define(gone, 0x10, False, "gone", what="uprobe:gone")
    msg = str(e.value)
    assert "uprobe support" not in msg
    assert msg.startswith("the kernel refused uprobe:gone: ")
    assert "Failed to find the given file" in msg or "No such file" in msg
    assert events.names == []


def test_close_ignores_probes_already_removed():
    events = UprobeEvents()
    event = events.define(os.path.realpath("/bin/true"),
                          0, False, "true")
    uprobe_events.remove_event(event)             # removed behind its back
    events.close()                                  # no error
    assert events.names == []
    assert event not in uprobe_events.defined_events()
