"""`-f html`: an interactive flame graph as one self-contained HTML file
(works offline: the script and style of assets/ are inlined, the merged tree
of flametree.py is embedded as JSON). `DiffFlameGraphReport` draws two runs
as a differential flame graph (`ustack report --diff A B`)."""
from __future__ import annotations

import html
import json
from functools import lru_cache
from importlib import resources
from io import TextIOBase

from ..model import StackCount
from .flametree import TreeReport, flat_json
from .formats import weight_of
from .text import format_duration, is_timed


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    """A file of report/assets/, shipped as package data."""
    return resources.files(__package__).joinpath("assets", name).read_text("utf-8")


def graph_title(context, default: str = "Flame graph") -> str:
    if context is not None and context.title:
        return context.title
    if context is not None and context.events:
        return f"{default}: {', '.join(context.events)}"
    return default


def unit_of(context) -> str:
    """Timed samples are `samples` (and a time); times (offcpu)
    `nanoseconds`; sizes (memleak) `bytes`; sums (count --weight) what
    they sum, `bytes (count)` or `sum of EXPR`; anything else `events`."""
    if is_timed(context):
        return "nanoseconds"
    weight = weight_of(context)
    if weight is not None:
        return weight.label
    if getattr(context, "value_unit", None) == "bytes":     # memleak
        return "bytes"
    return "samples" if context is not None and context.frequency else "events"


def amount(n: int, context) -> str:
    if is_timed(context):
        return format_duration(n)
    text = f"{n:,} {unit_of(context)}"
    if context is not None and context.frequency:
        text += f" ({n / context.frequency:.3f} s at {context.frequency} Hz)"
    return text


def _script_json(payload: dict) -> str:
    """JSON safe inside <script>: no `</script>` can end it early."""
    text = json.dumps(payload, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def render_page(title: str, subtitle: str, payload: dict) -> str:
    """The page, every resource inline."""
    page = asset("flamegraph.html")
    widths = {"nanoseconds": "time (off CPU)"}.get(payload["unit"], payload["unit"])
    for key, value in (("{{TITLE}}", html.escape(title)),
                       ("{{WIDTHS}}", widths),
                       ("{{SUBTITLE}}", html.escape(subtitle)),
                       ("{{CSS}}", asset("flamegraph.css")),
                       ("{{JS}}", asset("flamegraph.js")),
                       ("{{DATA}}", _script_json(payload))):
        page = page.replace(key, value)   # the data last: it is user text
    return page


def _payload(root, context, diff: bool) -> dict:
    return {"tree": flat_json(root), "diff": diff, "unit": unit_of(context),
            "frequency": context.frequency if context is not None else None}


class FlameGraphReport(TreeReport):
    """Counted stacks as an interactive HTML flame graph."""

    def finish(self, out: TextIOBase) -> None:
        root = self.tree()
        subtitle = f"{self.command()} · {amount(root.value, self.context)}"
        out.write(render_page(graph_title(self.context), subtitle,
                              _payload(root, self.context, diff=False)))


class DiffFlameGraphReport(FlameGraphReport):
    """Two runs as a differential flame graph, as FlameGraph's
    difffolded.pl + flamegraph.pl draw them: `add_before()` the stacks of
    run A (the baseline), `add()` those of run B. Widths are B's; a frame is
    red when its share of all samples grew from A to B, blue when it shrank,
    the deeper the larger the change. Frames only in A have no width in B:
    the page's "Widths from A" switch draws A's shape with the same colours
    (what `flamegraph.pl --negate` on the swapped difffolded output shows),
    so what vanished is seen in blue.

    Python frames are compared by function: a new version of a program
    moves lines, and a frame per line would split every function that moved
    into a red half and a blue half. `lines` (`--diff-lines`) keeps them
    apart, for two runs of one version."""

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None,
                 lines: bool = False):
        super().__init__(per_pid, offsets, context)
        self.lines = lines
        self.baseline: list = []

    def add_before(self, counted: StackCount) -> None:
        self.baseline.append(counted)

    def finish(self, out: TextIOBase) -> None:
        root = self.tree(before=self.baseline)
        subtitle = (f"A: {amount(root.before, self.context)} · "
                    f"B: {amount(root.value, self.context)} · widths from B, "
                    "red: share grew, blue: share shrank")
        out.write(render_page(graph_title(self.context, "Differential flame graph"),
                              subtitle, _payload(root, self.context, diff=True)))
