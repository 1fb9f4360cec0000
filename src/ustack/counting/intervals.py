"""A run counted interval by interval (`profile --every`, `top`): each
interval holds the samples taken in it, by their kernel timestamps
(CLOCK_MONOTONIC, as time.monotonic() reads it), not the samples decoded
while it lasted. A backlog (a loaded machine, unwind rows built while the
run goes) would otherwise put one interval's samples into the next, and
a file stating 1.28 s would hold 3.87 s of CPU samples on two CPUs.

An interval is cut when its time is up: the kernel's counts are read and
zeroed then (they hold what was counted since the last cut), and the
stream's samples stamped before the cut still go to it. It is handed out
once the stream has decoded everything sent before its end."""
from __future__ import annotations

import math
import time
from collections import namedtuple

from . import tally

MAX_NAMED_STACKS = 100_000      # symbolized stacks kept between intervals


class Interval(namedtuple("Interval", "counts start end partial")):
    """StackCounts of the samples taken in [start, end) (time.monotonic()
    seconds); `partial`: the run ended before the interval's time was up
    (Ctrl-C, the command exited, -d between two cuts)."""
    __slots__ = ()


class _Open:
    """An interval being counted: its bounds and counts so far."""

    def __init__(self, start: float, due: float):
        self.start, self.due = start, due
        self.end = math.inf
        self.counted: dict = {}


def interval_counts(session, seconds: float):
    """Run to the end, yielding an Interval every `seconds` (and the last
    one when the run ends, however short), counted from when the events
    went live, as -d is: -d 60 with 10 s intervals is six of them."""
    named: dict = {}                    # resolver key -> Stack, across intervals
    stack_of = session.resolver.stack_of

    def stack(rkey):
        found = named.get(rkey)
        if found is None:
            if len(named) > MAX_NAMED_STACKS:
                named.clear()
            found = named[rkey] = stack_of(rkey)
        return found

    def unwound(s):
        return tally.unwound_now(session, s)

    def done(interval: _Open, partial: bool = False) -> Interval:
        return Interval(tally.stack_counts(session, interval.counted, stack),
                        interval.start, interval.end, partial)

    session.start()
    key, settle = session.resolver.key, session.capture.settle
    weighed = session.weight is not None
    current = _Open(session.live_since, session.live_since + seconds)
    cut: list = []                      # ended, waiting for samples sent before their end
    ending = session.deadline if session.deadline is not None else math.inf
    latest = 0.0                        # the last sample's stamp
    for piece in session.pieces():
        now = time.monotonic()
        for s in piece.samples:
            taken = s.time_ns / 1e9 if s.time_ns else now
            into = next((c for c in cut if taken < c.end), current)
            into.start = min(into.start, taken)     # sent as the run went live
            latest = max(latest, taken)
            n = tally.weight_of(s) if weighed else 1
            s = settle(s, unwound)
            k = (s.probe, s.tid, key(s))
            into.counted[k] = into.counted.get(k, 0) + n
        now = time.monotonic()
        if current.due <= now < ending and session.stream.stopped_at is None:
            counted = tally.kernel_counted(session, reset=True)
            current.end = time.monotonic()          # all the kernel counted came before
            tally.add_counts(session, current.counted, counted)
            cut.append(current)
            due = current.due + seconds     # on the schedule from the start,
            while due <= current.end:       # even when far behind it
                due += seconds
            current = _Open(current.end, due)
        decoded = session.stream.decoded_until()
        while cut and cut[0].end <= decoded:
            yield done(cut.pop(0))
    # the stream was read to its end: every interval has its samples
    for interval in cut:
        yield done(interval)
    tally.add_counts(session, current.counted, tally.kernel_counted(session, reset=True))
    session.whole = True
    current.end = max(session.stream.stopped_at, current.start, latest + 1e-9)
    yield done(current, partial=current.end < current.due - 1e-3)
