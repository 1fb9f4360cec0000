"""What a run says it lost is events, exactly: 64 threads calling a
function a known number of times, traced through a buffer too small to
hold them (perf backend): delivered + lost == calls. The fork, exec and
mmap records the full buffer also dropped are not events and are said
apart; with room enough, every call is delivered and nothing is lost."""
from __future__ import annotations

import re

import pytest

from helpers import build, ok, run_ustack

THREADS, CALLS = 64, 2000


def _delivered_and_lost(res) -> tuple:
    delivered = sum(1 for line in res.stdout.splitlines() if line.startswith("threads "))
    lost = [int(m.group(1)) for m in re.finditer(r"^Lost (\d+) events", res.stderr, re.M)]
    assert len(lost) <= 1, res.stderr
    return delivered, sum(lost)


@pytest.mark.kernel
@pytest.mark.parametrize("pages", [1, 1024])
def test_delivered_plus_lost_is_the_calls(pages):
    prog = build("threads")
    res = ok(run_ustack("trace", f"uprobe:{prog}:thread_d", "--backend", "perf",
                        "--buffer-pages", pages, "-c", f"{prog} 0 {CALLS} {THREADS}",
                        timeout=120))
    delivered, lost = _delivered_and_lost(res)
    assert delivered + lost == THREADS * CALLS, res.stderr
    if pages == 1:
        assert lost > 0, "nothing was lost: the test proves nothing"
    elif lost == 0:
        assert "Lost" not in res.stderr, res.stderr
