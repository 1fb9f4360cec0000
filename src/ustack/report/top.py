"""`ustack top`'s table: the hottest functions of a profile by self and
by total (inclusive) samples, from the StackCounts of each refresh, as
lines of text (the command draws them on a terminal or prints them)."""
from __future__ import annotations

from ..model import StackCount, unnamed_function

SORTS = ("self", "total")
COLUMNS = f"{'%SELF':>6} {'%TOTAL':>6} {'SELF':>8} {'TOTAL':>8}  FUNCTION"


def function_key(f) -> tuple:
    """What one row of the table is: a function of its module (not a call
    site, not a line); an unnamed frame by its module; an interpreter's or
    a JIT's frame as a function of its own kind, `leaf (app.py)`."""
    if f.kind:
        return (f.kind, f"{f.function} ({f.module})" if f.module else f.function or "?")
    if f.function is None and unnamed_function(f):  # code apart: `fn@0x11e0 [prog]`
        return ("", f"{unnamed_function(f)} [{f.module}]")
    if f.function is None:              # by its module: `[libfoo.so]`, `[uprobes]`
        name = f.module if f.module.startswith("[") else f"[{f.module}]"
        return ("", name if f.module else "[unknown]")
    return (f.module, f.function + (" (inlined)" if f.inlined else ""))


def self_frame(frames: tuple):
    """The frame a sample's self time goes to: the innermost frame, but
    in a stack running interpreted or JIT code the innermost frame of that
    code (the interpreter's C frames below it are its work, as py-spy top
    counts it); None for an empty stack."""
    for f in frames:
        if f.kind:
            return f
    return frames[0] if frames else None


class FunctionTable:
    """Self and total samples per function, for the last refresh and for
    the whole run."""

    def __init__(self):
        self.self_now: dict = {}
        self.total_now: dict = {}
        self.self_all: dict = {}
        self.total_all: dict = {}
        self.samples_now = 0
        self.samples_all = 0
        self.refreshes = 0

    def refresh(self, counts: list) -> None:
        """The StackCounts counted since the last refresh replace the
        last refresh's and add to the run's."""
        self.self_now, self.total_now, self.samples_now = {}, {}, 0
        for sc in counts:
            self._add(sc)
        for now, run in ((self.self_now, self.self_all), (self.total_now, self.total_all)):
            for key, n in now.items():
                run[key] = run.get(key, 0) + n
        self.samples_all += self.samples_now
        self.refreshes += 1

    def _add(self, sc: StackCount) -> None:
        n, frames = sc.count, sc.stack.frames
        self.samples_now += n
        leaf = self_frame(frames)
        if leaf is None:
            key = ("", "[no user stack]")
            self.self_now[key] = self.self_now.get(key, 0) + n
            self.total_now[key] = self.total_now.get(key, 0) + n
            return
        self.self_now[function_key(leaf)] = self.self_now.get(function_key(leaf), 0) + n
        for key in {function_key(f) for f in frames}:     # recursion counts once
            self.total_now[key] = self.total_now.get(key, 0) + n

    def rows(self, sort: str = "self") -> list:
        """(key, self now, total now, self in the run, total in the run),
        hottest first: by the last refresh, then by the run."""
        keys = set(self.total_all)
        if sort == "total":
            def order(k):
                return (self.total_now.get(k, 0), self.total_all.get(k, 0),
                        self.self_now.get(k, 0))
        else:
            def order(k):
                return (self.self_now.get(k, 0), self.self_all.get(k, 0),
                        self.total_now.get(k, 0))
        ranked = sorted(keys, key=lambda k: (tuple(-n for n in order(k)), k))
        return [(k, self.self_now.get(k, 0), self.total_now.get(k, 0),
                 self.self_all.get(k, 0), self.total_all.get(k, 0)) for k in ranked]


def format_rows(table: FunctionTable, sort: str, limit: int | None, width: int | None) -> list:
    """The column titles and up to `limit` rows, each cut to `width`
    characters: `%SELF %TOTAL SELF TOTAL FUNCTION [module]`, the
    percentages of the last refresh's samples, the counts the run's."""
    now = table.samples_now
    lines = [COLUMNS]
    for (module, name), s_now, t_now, s_all, t_all in table.rows(sort)[:limit]:
        where = f" [{module}]" if module else ""
        lines.append(f"{_percent(s_now, now):>6} {_percent(t_now, now):>6} "
                     f"{s_all:>8} {t_all:>8}  {name}{where}")
    return [line[:width] for line in lines] if width else lines


def _percent(n: int, whole: int) -> str:
    return f"{100 * n / whole:.1f}%" if whole else "-"


def format_header(target: str, table: FunctionTable, lost: int, backend: str,
                  elapsed: float, sort: str) -> list:
    """The two lines above the table: what is profiled; the samples of the
    last refresh and of the run, the losses, the backend, the time."""
    return [f"ustack top: {target}",
            f"samples {table.samples_now:,} (total {table.samples_all:,}), "
            f"lost {lost:,}; backend {backend}; {elapsed:.0f} s; sorted by {sort}"]
