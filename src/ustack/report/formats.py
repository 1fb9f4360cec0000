"""The output formats of counted stacks (`-f`), one module each behind one
interface: `add(StackCount)` for every stack with its count, then
`finish(out)` writes the whole report. A new format is a new module and a
line here."""
from __future__ import annotations

from .counts import CountsReport
from .folded import FoldedReport

FORMATS = {
    "text": CountsReport,
    "folded": FoldedReport,
}


def stack_report(name: str, per_pid: bool = False, offsets: bool = False):
    """A new report of format `name` (one of FORMATS)."""
    return FORMATS[name](per_pid=per_pid, offsets=offsets)
