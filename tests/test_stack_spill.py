"""Counts never dropped by the stack storage's size: when the in-kernel
unwinder's STACKS map is half full, its stacks move to ustack
(KernelUnwinder.spill) and the kernel goes on storing new ones.

qsort_cb sorting 8,000 ints calls its comparator 93,390 times through
~8,000 distinct stacks (glibc's merge sort recursing: which half, how
deep): eight times what `--stack-storage-size 1024` holds, as 40,000 ints
(~20,000 stacks) outnumber the default 16,384 entries. Before, about a
quarter of the calls were reported not counted."""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import O2_NOFP, build, ok, run_ustack

pytestmark = pytest.mark.kernel

STORAGE = 1024


def test_every_call_counted_when_stacks_outnumber_the_storage():
    prog = build("qsort_cb", flags=O2_NOFP)
    calls = int(subprocess.run([str(prog), "8000", "count"], capture_output=True,
                               text=True, check=True).stdout)
    res = ok(run_ustack("count", f"uprobe:{prog}:cmp", "--stack-storage-size", STORAGE,
                        "-f", "json", "-c", f"{prog} 8000", timeout=300))
    assert "not counted" not in res.stderr, res.stderr
    stacks = json.loads(res.stdout)["stacks"]
    distinct = {tuple(f["address"] for f in s["frames"]) for s in stacks}
    assert len(distinct) > 4 * STORAGE, "the storage was never outnumbered"
    assert sum(s["count"] for s in stacks) == calls
    assert all(s["frames"][0]["function"] == "cmp" for s in stacks), stacks[:2]
