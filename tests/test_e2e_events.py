"""The event spellings the README lists beyond uprobe and syscall:write,
end to end: uretprobe, tracepoint:GROUP:NAME, syscall:* globs, uprobe globs
naming several functions, and profile:hz:N as an EVENT of count."""
from __future__ import annotations

import pytest

from helpers import (CHAIN, build, disassembly, funcs, ok, parse_counts, parse_trace,
                     return_offset, run_ustack)


@pytest.fixture(scope="module")
def chain():
    return build("chain")


@pytest.mark.kernel
def test_uretprobe_fires_in_the_caller(chain):
    """At a return probe d has returned: the stack starts in c, at the
    instruction after the call (as bpftrace's uretprobe ustack does)."""
    n = 5
    res = ok(run_ustack("trace", f"uretprobe:{chain}:d", "-c", f"{chain} {n}"))
    records = parse_trace(res.stdout)
    assert len(records) == n, res.stdout
    after_call = return_offset(disassembly(chain), "c", "d")
    for rec in records:
        assert rec["label"] == f"uretprobe:{chain}:d"
        assert funcs(rec["frames"])[:4] == CHAIN[1:], rec
        assert rec["frames"][0]["off"] == after_call, rec   # in c, just past the call


@pytest.mark.kernel
def test_tracepoint_spelling_counts_like_syscall(chain):
    n = 4
    via_tp = ok(run_ustack("count", "tracepoint:syscalls:sys_enter_write",
                           "-c", f"{chain} {n} rawwrite"))
    via_sc = ok(run_ustack("count", "syscall:write", "-c", f"{chain} {n} rawwrite"))
    for res in (via_tp, via_sc):
        stacks = parse_counts(res.stdout)
        assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, n)], \
            res.stdout


@pytest.mark.kernel
def test_exec_tracepoint_counts_the_command_s_own_exec(chain):
    """sched_process_exec under -c: the command's own exec is counted too
    (the program arming the run at that exec runs before the count's), and
    each exec of its children: sh, then chain twice (the second exec'd by
    sh in place)."""
    res = ok(run_ustack("count", "-P", "tracepoint:sched:sched_process_exec",
                        "-c", f"sh -c '{chain} 1; {chain} 1'"))
    stacks = parse_counts(res.stdout)
    assert sorted((s["comm"], s["count"]) for s in stacks) == \
        [("chain", 1), ("chain", 1), ("sh", 1)], res.stdout


@pytest.mark.kernel
def test_syscall_glob_includes_every_write(chain):
    """A syscall glob opens one event per syscall it matches; the n writes
    from d are among what it counts, each with the full chain (rawwrite: the
    syscall is in d). [mw]* rather than * keeps the ~30 events' closing short."""
    n = 3
    res = ok(run_ustack("trace", "syscall:[mw]*", "-c", f"{chain} {n} rawwrite"))
    records = parse_trace(res.stdout)
    writes = [r for r in records if r["label"] == "syscall:write"]
    assert len(writes) == n, [r["label"] for r in records]
    for rec in writes:
        assert funcs(rec["frames"])[:5] == CHAIN, rec
    assert {"syscall:mmap", "syscall:mprotect"} <= {r["label"] for r in records}  # the loader's


@pytest.mark.kernel
def test_uprobe_glob_places_one_probe_per_function(chain):
    n = 2
    res = ok(run_ustack("trace", f"uprobe:{chain}:[bd]", "-c", f"{chain} {n}"))
    labels = [r["label"] for r in parse_trace(res.stdout)]
    assert labels == [f"uprobe:{chain}:b"] + [f"uprobe:{chain}:d"] * n, labels


@pytest.mark.kernel
def test_profile_event_in_count():
    busy = build("busy")
    res = ok(run_ustack("count", "profile:hz:199", "-c", f"{busy} 1"))
    stacks = parse_counts(res.stdout)
    total = sum(s["count"] for s in stacks)
    assert total >= 100, res.stdout
    assert funcs(stacks[-1]["frames"])[:3] == ["spin_here", "work", "main"], res.stdout
    assert stacks[-1]["count"] >= 0.8 * total, res.stdout
