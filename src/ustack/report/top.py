"""`ustack top`'s table: the hottest functions of a profile by self and
by total (inclusive) samples, a row per function of each process (which of
several pythons is hot is the first thing asked), from the StackCounts of
each refresh, as lines of text (the command draws them on a terminal or
prints them)."""
from __future__ import annotations

from ..model import StackCount, unnamed_function

SORTS = ("self", "total", "function", "pid")
MIN_FUNCTION = 20               # columns the function keeps on a narrow terminal


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
    """Self and total samples per function of each process, for the last
    refresh and for the whole run. A row's key: (pid, comm, module, name)."""

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
        process = (sc.pid, sc.comm)
        self.samples_now += n
        leaf = self_frame(frames)
        if leaf is None:
            key = process + ("", "[no user stack]")
            self.self_now[key] = self.self_now.get(key, 0) + n
            self.total_now[key] = self.total_now.get(key, 0) + n
            return
        key = process + function_key(leaf)
        self.self_now[key] = self.self_now.get(key, 0) + n
        for key in {process + function_key(f) for f in frames}:   # recursion counts once
            self.total_now[key] = self.total_now.get(key, 0) + n

    def rows(self, sort: str = "self") -> list:
        """(key, self now, total now, self in the run, total in the run),
        in the order `sort` asks: self and total hottest first (by the last
        refresh, then by the run), function by name, pid by process (each
        process's hottest first). Equal totals put the function with fewer
        samples of its own first: a caller above the callee it is always
        in, as a call tree reads."""
        def hot(k):
            if sort == "total":
                return (-self.total_now.get(k, 0), -self.total_all.get(k, 0),
                        self.self_now.get(k, 0), self.self_all.get(k, 0))
            return (-self.self_now.get(k, 0), -self.self_all.get(k, 0),
                    -self.total_now.get(k, 0))
        if sort == "function":
            def order(k):
                return (k[3], k[2], k[0])
        elif sort == "pid":
            def order(k):
                return (k[0], hot(k), k)
        else:
            def order(k):
                return (hot(k), k)
        return [(k, self.self_now.get(k, 0), self.total_now.get(k, 0),
                 self.self_all.get(k, 0), self.total_all.get(k, 0))
                for k in sorted(self.total_all, key=order)]


def _percent(n: int, whole: int) -> str:
    return f"{100 * n / whole:.1f}%" if whole else "-"


# The columns before FUNCTION: title, width, the row's text. A narrow
# terminal drops them in DROP_ORDER until FUNCTION has MIN_FUNCTION columns
# (%SELF stays, and PID as long as it can: which process is hot): the
# function is what a row is about.
COLUMNS = (
    ("PID", 7, lambda r, now: str(r[0][0])),
    ("COMMAND", -15, lambda r, now: r[0][1][:15]),
    ("%SELF", 6, lambda r, now: _percent(r[1], now)),
    ("%TOTAL", 6, lambda r, now: _percent(r[2], now)),
    ("SELF", 8, lambda r, now: str(r[3])),
    ("TOTAL", 8, lambda r, now: str(r[4])),
)
DROP_ORDER = ("TOTAL", "SELF", "COMMAND", "%TOTAL", "PID")


def _cell(text: str, width: int) -> str:
    return text.ljust(-width) if width < 0 else text.rjust(width)


def shown_columns(width: int | None) -> list:
    """The columns before FUNCTION that fit beside MIN_FUNCTION columns of
    it in `width` (all of them when there is no width: a pipe, a file)."""
    shown = list(COLUMNS)
    for name in DROP_ORDER:
        if width is None or width - sum(abs(w) + 1 for _t, w, _f in shown) - 1 >= MIN_FUNCTION:
            break
        shown = [c for c in shown if c[0] != name]
    return shown


def format_rows(table: FunctionTable, sort: str, limit: int | None, width: int | None) -> list:
    """The column titles and up to `limit` rows, each cut to `width`
    characters: `PID COMMAND %SELF %TOTAL SELF TOTAL FUNCTION [module]`,
    the percentages of the last refresh's samples, the counts the run's;
    a narrow width drops columns before it cuts the function."""
    now = table.samples_now
    columns = shown_columns(width)

    def line(cells: list, function: str) -> str:
        return " ".join(_cell(text, w) for text, (_t, w, _f) in zip(cells, columns)) \
            + "  " + function

    lines = [line([title for title, _w, _f in columns], "FUNCTION")]
    for row in table.rows(sort)[:limit]:
        _pid, _comm, module, name = row[0]
        where = f" [{module}]" if module else ""
        lines.append(line([text(row, now) for _t, _w, text in columns], name + where))
    return [text[:width] for text in lines] if width else lines


def format_header(target: str, table: FunctionTable, lost: int, backend: str,
                  elapsed: float, sort: str) -> list:
    """The two lines above the table: what is profiled; the samples of the
    last refresh and of the run, the losses, the backend, the time."""
    return [f"ustack top: {target}",
            f"samples {table.samples_now:,} (total {table.samples_all:,}), "
            f"lost {lost:,}; backend {backend}; {elapsed:.0f} s; sorted by {sort}"]
