"""Counts never dropped by the default stack storage: when the in-kernel
unwinder's STACKS map is half full, its stacks move to ustack
(KernelUnwinder.spill) and the kernel goes on storing new ones.

qsort_cb sorting 40,000 ints calls its comparator 563,961 times through
more distinct stacks (glibc's merge sort recursing: which half, how deep)
than the default 16,384 entries hold; before, ~150,000 calls were
reported not counted."""
from __future__ import annotations

import subprocess

import pytest

from helpers import O2_NOFP, build, ok, parse_counts, run_ustack

pytestmark = pytest.mark.kernel


def test_every_call_counted_with_the_default_storage():
    prog = build("qsort_cb", flags=O2_NOFP)
    calls = int(subprocess.run([str(prog), "40000", "count"], capture_output=True,
                               text=True, check=True).stdout)
    res = ok(run_ustack("count", f"uprobe:{prog}:cmp", "-c", f"{prog} 40000",
                        timeout=300))
    stacks = parse_counts(res.stdout)
    assert "not counted" not in res.stderr, res.stderr
    assert sum(s["count"] for s in stacks) == calls
    assert all(s["frames"][0][0] == "cmp" for s in stacks), stacks[:2]
