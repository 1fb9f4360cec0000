"""`ustack count` of several events keeps each event's stacks apart and
names the event: two probes in one function, hit 1000 times each from the
same stack, are 1000 and 1000, never one stack of 2000 (text: a header
line per event; folded: the event as the root frame)."""
from __future__ import annotations

import pytest

from helpers import FP, build, funcs, ok, parse_counts, parse_folded, run_ustack

pytestmark = pytest.mark.kernel

CHAIN = ["d", "c", "b", "a", "main"]


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def events(chain) -> list:
    # d's first instruction and the one after `push %rbp; mov %rsp,%rbp`
    return [f"uprobe:{chain}:d", f"uprobe:{chain}:d+0x4"]


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_text_counts_each_event_under_its_name(chain, backend):
    res = ok(run_ustack("count", *events(chain), "--backend", backend,
                        "-c", f"{chain} 1000"))
    stacks = parse_counts(res.stdout)
    assert [(s["event"], s["count"]) for s in stacks] == [
        (e, 1000) for e in events(chain)], res.stdout
    assert all(funcs(s["frames"])[:5] == CHAIN for s in stacks), res.stdout


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_folded_roots_each_stack_at_its_event(chain, backend):
    res = ok(run_ustack("count", *events(chain), "--backend", backend,
                        "-c", f"{chain} 1000", "-f", "folded"))
    rows = sorted(parse_folded(res.stdout))
    assert [(names[0], names[1], n) for names, n in rows] == [
        (e, "chain", 1000) for e in sorted(events(chain))], res.stdout
    assert all(names[-5:] == CHAIN[::-1] for names, _ in rows), res.stdout


def test_one_event_has_no_header_nor_root(chain):
    """What a single event's output always was."""
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 10"))
    assert res.stdout.startswith("  d [chain]\n"), res.stdout
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 10", "-f", "folded"))
    assert res.stdout.startswith("chain;") and res.stdout.endswith(";d 10\n"), res.stdout
