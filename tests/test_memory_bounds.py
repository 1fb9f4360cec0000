"""A million events traced stay within 200 MB of memory, whatever the
reader's backlog: DWARF stacks (8 KiB copied per event, unwound at tens of
thousands a second) fall far behind a tight loop's probe, so what is held
unread is what the bounds (a CPU buffer read a few MiB at a time, a
backlog of at most 32 MiB) allow."""
from __future__ import annotations

import pytest

from helpers import build, ok, run_ustack_peak

EVENTS = 1_000_000


@pytest.mark.kernel
@pytest.mark.parametrize("how", [(), ("--backend", "perf", "--unwind", "fp"),
                                 ("--backend", "perf", "--unwind", "dwarf")],
                         ids=["default", "perf-fp", "perf-dwarf"])
def test_million_event_trace_peak_memory(how):
    prog = build("chain")
    res, peak_mb = run_ustack_peak("trace", f"uprobe:{prog}:d", *how,
                                   "-c", f"{prog} {EVENTS}",
                                   discard_stdout=True, timeout=300)
    ok(res)
    assert peak_mb < 200, f"peak RSS {peak_mb:.0f} MB\n{res.stderr}"
