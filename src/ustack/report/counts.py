"""`-f text` of count and profile: bcc stackcount's layout, frames innermost
first, then the count; least to most frequent. A weighted count's line
names what it sums: `600 bytes (count)`, `650 (sum of n)`. A run of
several events counts each apart, under a line naming it (unindented),
the events in the order given."""
from __future__ import annotations

from io import TextIOBase

from ..model import SCRIPT_KINDS, StackCount, unnamed_function
from .aggregate import merge
from .formats import weight_of
from .text import format_duration, frame_label, is_timed, python_label


def function_label(f) -> str:
    """`func [module]`: a frame without the call site's offset (then
    ` file:line` when lines were asked for)."""
    if f.kind in SCRIPT_KINDS:
        return python_label(f)
    module = f" [{f.module}]" if f.module else ""
    where = f" {f.file}:{f.line}" if f.line else ""
    inlined = " (inlined)" if f.inlined else ""
    name = f.function or unnamed_function(f) or "[unknown]"
    return f"{name}{inlined}{module}{where}"


def ids(host: int, inner: int) -> str:
    """A pid as ours/its own, `4321/7`, when its pid namespace (a
    container's) numbers it differently; else just ours."""
    return f"{host}/{inner}" if inner and inner != host else str(host)


def format_counts(counts, per_pid: bool = False, offsets: bool = False,
                  timed: bool = False, unit: str = "", events=()) -> str:
    """`timed`: counts are nanoseconds, shown as a time; `unit`: what
    follows each count; `events`: the run's, in order (with more than one,
    a header line names each event's stacks)."""
    merged = merge(counts, per_pid, offsets)
    if len(events) <= 1 and len({sc.event for sc in merged}) <= 1:
        return _format_stacks(merged, per_pid, offsets, timed, unit)
    order = {event: i for i, event in enumerate(events)}
    by_event: dict = {}
    for sc in merged:
        by_event.setdefault(sc.event, []).append(sc)
    return "".join(f"{event}\n" + _format_stacks(by_event[event], per_pid, offsets, timed, unit)
                   for event in sorted(by_event, key=lambda e: (order.get(e, len(order)), e)))


def _format_stacks(merged, per_pid: bool, offsets: bool, timed: bool, unit: str) -> str:
    label = frame_label if offsets else function_label
    out = []
    for sc in merged:
        out.extend(f"  {label(f)}" for f in sc.stack.frames)
        out.extend(f"  ({note})" for note in sc.stack.notes)
        if per_pid:
            out.append(f"    {sc.comm} [{ids(sc.pid, sc.ns_pid)}]"
                       + (f" tid {ids(sc.tid, sc.ns_tid)}" if sc.tid else ""))
        out.append(f"    {format_duration(sc.count) if timed else sc.count}{unit}")
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


class CountsReport:
    """Stacks by frequency as text."""

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        self.per_pid, self.offsets = per_pid, offsets
        self.timed = is_timed(context)
        weight = weight_of(context)
        self.unit = "" if weight is None else (
            f" {weight.label}" if weight.unit else f" ({weight.label})")
        self.events = tuple(getattr(context, "events", ()))
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: TextIOBase) -> None:
        out.write(format_counts(self.counted, self.per_pid, self.offsets, self.timed,
                                self.unit, self.events))
