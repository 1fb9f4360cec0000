"""`-f folded`: `comm;outermost;…;innermost COUNT` lines, as FlameGraph's
stackcollapse scripts and bcc `profile -f` write them. A run of several
events puts the event first, as the root frame (`syscall:write;comm;…`):
flamegraph.pl then draws one flame per event side by side, and
`grep '^syscall:write;'` keeps one event's."""
from __future__ import annotations

from io import TextIOBase

from ..model import SCRIPT_KINDS, StackCount, unnamed_function
from .text import is_timed


def folded_name(f) -> str:
    if f.kind in SCRIPT_KINDS and f.line:
        return python_name(f).replace(";", ":")
    if f.function:
        return f.function.replace(";", ":").replace(" ", "_")
    unnamed = unnamed_function(f)
    if unnamed is not None:                      # fn@0x11e0_[prog]: apart from its neighbours
        return f"{unnamed}_[{f.module}]".replace(";", ":").replace(" ", "_")
    return f"[{f.module}]" if f.module else "[unknown]"


def python_name(f) -> str:
    """A Python frame as py-spy's raw output names it: `func (file.py:LINE)`."""
    return f"{f.function} ({f.module}:{f.line})"


def note_name(note: str) -> str:
    """An unwinder's note as a frame at the root side of the stack (where
    the frames it could not find would stand), as the flame graphs show it:
    a cut stack must not read as complete and rooted mid-stack."""
    return f"[{note}]".replace(";", ":").replace(" ", "_")


def folded_name_of_event(label: str) -> str:
    return label.replace(";", ":").replace(" ", "_")


def format_folded(counts, per_pid: bool = False, timed: bool = False,
                  events=()) -> str:
    """`timed`: counts are nanoseconds, written in microseconds (bcc
    offcputime -f's unit); `events`: the run's (with more than one, each
    line starts with its event)."""
    lines: dict = {}
    by_event = len(events) > 1 or len({sc.event for sc in counts}) > 1
    for sc in counts:
        names = ([note_name(n) for n in sc.stack.notes]
                 + [folded_name(f) for f in reversed(sc.stack.frames)])
        head = f"{sc.comm}-{sc.pid}" if per_pid else sc.comm
        if per_pid and sc.tid:                   # -T: comm-pid/tid
            head += f"/{sc.tid}"
        line = ";".join([head.replace(" ", "_")] + names)
        if by_event:
            line = f"{folded_name_of_event(sc.event)};{line}"
        lines[line] = lines.get(line, 0) + sc.count
    if timed:
        lines = {line: n // 1000 for line, n in lines.items()}
    return "".join(f"{line} {n}\n" for line, n in
                   sorted(lines.items(), key=lambda kv: (kv[1], kv[0])))


class FoldedReport:
    """Stacks by frequency as folded lines (per_pid: `comm-PID` first)."""

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        self.per_pid = per_pid            # offsets: folded lines name functions only
        self.timed = is_timed(context)
        self.events = tuple(getattr(context, "events", ()))
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: TextIOBase) -> None:
        out.write(format_folded(self.counted, self.per_pid, self.timed, self.events))
