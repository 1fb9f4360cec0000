"""Two sides of a differential flame graph (two recordings, two time
ranges or hosts of `report --from`), paired stack by stack, and written
baseline first."""
from __future__ import annotations

from typing import NamedTuple

from ..model import StackCount, UstackError
from .aggregate import stack_identity
from .output import open_output


class DiffRow(NamedTuple):
    """One stack (as the formats merge stacks: named frames) and its counts
    in the first recording (before) and the second (after)."""
    stack: StackCount                   # comm, pid, stack and event of either run
    before: int
    after: int


def diff_rows(before, after, per_pid: bool = False, offsets: bool = False) -> list:
    """The StackCounts of two runs paired by identity (report/aggregate's
    stack_identity): a row per stack seen in either, with both counts."""
    rows: dict = {}
    for side, counts in ((0, before), (1, after)):
        for sc in counts:
            key = stack_identity(sc, per_pid, offsets)
            have = rows.get(key)
            if have is None:
                have = rows[key] = [sc, 0, 0]
            have[1 + side] += sc.count
    return [DiffRow(sc, a, b) for sc, a, b in rows.values()]


def diff_report_class():
    """The differential flame graph's class, or why there is none."""
    try:
        from .flamegraph_html import DiffFlameGraphReport
    except ImportError:
        raise UstackError("differential flame graphs need the HTML flame graph "
                          "(report/flamegraph_html.py: DiffFlameGraphReport), "
                          "which this ustack does not have") from None
    return DiffFlameGraphReport


def write_diff(fmt, rows, output: str | None, binary: bool) -> None:
    """A differential report of diff_rows(): the baseline's counts first."""
    with open_output(output, binary=binary) as out:
        for row in rows:
            if row.before:
                fmt.add_before(with_count(row.stack, row.before))
        for row in rows:
            if row.after:
                fmt.add(with_count(row.stack, row.after))
        fmt.finish(out)


def with_count(sc: StackCount, n: int) -> StackCount:
    return StackCount(sc.comm, sc.pid, sc.stack, n, sc.event)
