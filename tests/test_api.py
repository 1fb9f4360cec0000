"""The Python API (README, "Python API"): a script iterates a run's events
with their symbolized stacks, or gets its counted stacks, through the same
Session the `ustack` command uses; leaving the `with` block early removes
every probe (the leftover check in conftest.py watches this process)."""
from __future__ import annotations

import pytest

from helpers import CHAIN, FP, build

import ustack

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def test_events_with_stacks(chain):
    opts = ustack.Options(command="trace", events=[f"uprobe:{chain}:d"],
                          cmdline=f"{chain} 3")
    with ustack.Session(opts) as run:
        events = list(run.events())
        assert run.capture.losses().lost == 0
    assert len(events) == 3
    for event in events:
        assert event.label == f"uprobe:{chain}:d"
        assert event.comm == "chain" and event.sample.pid == run.target.pid
        assert [f.function for f in event.stack.frames][:len(CHAIN)] == list(CHAIN)


def test_counts(chain):
    opts = ustack.Options(command="count", events=["syscall:write"],
                          cmdline=f"{chain} 100 write")
    with ustack.Session(opts) as run:
        counted = run.counts()
    assert [c.count for c in counted] == [100]
    names = [f.function for f in counted[0].stack.frames]
    assert names[0] == "write" and names[1:1 + len(CHAIN)] == list(CHAIN)


def test_leaving_early_cleans_up(chain):
    opts = ustack.Options(command="trace", events=[f"uprobe:{chain}:d"],
                          cmdline=f"{chain} 100000")
    with ustack.Session(opts) as run:
        for _event in run.events():
            break                      # the generator is closed, then the run
    assert run.target.exit_status is not None


def test_errors_are_ustack_errors(chain):
    opts = ustack.Options(command="trace", events=[f"uprobe:{chain}:nosuch"],
                          cmdline=f"{chain} 1")
    with pytest.raises(ustack.UstackError, match="no function 'nosuch'"):
        with ustack.Session(opts):
            pass
