"""`ustack latency` as text: a log2 histogram per function (or per function
and calling stack) in bpftrace's hist() layout, with count, min, avg and
max; and funcslower's line per slow call, with its stack."""
from __future__ import annotations

from ..model import Stack
from .counts import function_label
from .text import format_stack, format_time, header_parts

BAR = 52                             # bpftrace's bar width


def format_duration(ns: float, unit: str, unit_ns: int) -> str:
    value = ns / unit_ns
    text = f"{value:.0f}" if value >= 100 or unit == "ns" else f"{value:.3g}"
    return f"{text}{unit}"


def bucket_label(i: int, unit: str) -> str:
    """Bucket 0 holds durations under one unit; bucket i, [2^(i-1), 2^i)."""
    if i == 0:
        return f"[0, 1{unit})"
    return f"[{1 << (i - 1)}{unit}, {1 << i}{unit})"


def format_histogram(title: str, count: int, total_ns: int, min_ns: int, max_ns: int,
                     buckets: list, unit: str, unit_ns: int,
                     stack: Stack = None) -> str:
    d = lambda ns: format_duration(ns, unit, unit_ns)      # noqa: E731
    if not count:                      # named, never called
        return f"{title}: count 0\n\n"
    lines = [f"{title}: count {count}, min {d(min_ns)}, avg {d(total_ns / count)}, "
             f"max {d(max_ns)}"]
    if stack is not None:
        lines.extend(f"  {function_label(f)}" for f in stack.frames)
        lines.extend(f"  ({note})" for note in stack.notes)
    used = [i for i, n in enumerate(buckets) if n]
    if used:
        top = max(buckets)
        width = max(len(bucket_label(i, unit)) for i in range(used[0], used[-1] + 1))
        for i in range(used[0], used[-1] + 1):
            n = buckets[i]
            bar = "@" * (n * BAR // top) if top else ""
            lines.append(f"{bucket_label(i, unit):<{width}} {n:>8} |{bar:<{BAR}}|")
    return "\n".join(lines) + "\n\n"


def format_slow_call(comm: str, pid: int, tid: int, cpu: int, time_ns: int, label: str,
                     duration_ns: int, unit: str, unit_ns: int, stack: Stack) -> str:
    """One slow call as trace prints an event (`comm pid/tid [cpu] seconds:
    event took 12.3ms`; the time and CPU of its return), then the stack at
    its entry."""
    head, tail = header_parts(comm, pid, tid, cpu,
                              f"{label} took {format_duration(duration_ns, unit, unit_ns)}")
    return head + format_time(time_ns) + tail + format_stack(stack)
