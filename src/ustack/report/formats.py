"""The output formats, one module each, behind two interfaces.

Counted stacks (`count`, `profile`, `report`): `Format(per_pid=, offsets=,
context=)`, then `add(StackCount)` for every stack with its count, then
`finish(out)` writes the whole report; `out` is a text stream, or a binary
one when the class says `binary = True`.

Events (`trace`, `report` of a trace recording): `Format(out, labels)`,
then `add(sample, stack, comm_of)` per event (`comm_of(pid, tid, time_ns)`:
the thread's name at the event), `renamed()` when a thread's name changed
and `flush()` when the stream pauses (see trace.py).

A new format is a new module and a line here; `-o FILE` picks one by the
file's name (EXTENSIONS) when -f is not given."""
from __future__ import annotations

import importlib
from collections.abc import Mapping

from ..model import UstackError
from ..values import value


class _Registry(Mapping):
    """Format name -> its class, imported when first asked for: a run
    imports only the format it writes (all of them cost ~50 ms of start-up,
    before the traced command may run)."""

    def __init__(self, specs: dict):
        self._specs = specs            # name -> "module:Class" (relative to report/)
        self._classes: dict = {}

    def __getitem__(self, name: str):
        found = self._classes.get(name)
        if found is None:
            module, _, attr = self._specs[name].partition(":")
            found = getattr(importlib.import_module(f".{module}", __package__), attr)
            self._classes[name] = found
        return found

    def __contains__(self, name) -> bool:     # (Mapping's would import it)
        return name in self._specs

    def __iter__(self):
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


@value
class ReportContext:
    """What a format may want to say about the run beside its stacks."""
    command: str = "count"             # count | profile | report | …
    events: tuple = ()                 # the events, as the header shows them
    frequency: int | None = None    # profile: samples/s, so a count is a time
    title: str = ""                    # the command line, for a page's title
    start_ns: int | None = None     # wall-clock time the run began (ns since 1970)
    # what a StackCount's `count` is: None for events (or samples of a
    # profile), "nanoseconds" when it is a time (offcpu), "bytes" a size (memleak)
    value_unit: str | None = None
    # count --weight: a count is the sum of this argument (probes.weight.Weight)
    weight: object | None = None
    # profile --every: the interval's length and lines said about it (pprof)
    duration_ns: int = 0
    comments: tuple = ()

    @property
    def timed(self) -> bool:
        """Whether counts are nanoseconds (show them as time)."""
        return self.value_unit == "nanoseconds"


def run_context(command: str, labels, frequency: int | None = None,
                start_ns: int | None = None,
                value_unit: str | None = None, weight=None) -> ReportContext:
    """The context of a run's report, the same live and from its recording."""
    if frequency:                      # timed samples are a profile, recorded or not
        title = f"ustack profile at {frequency} Hz"
    else:
        what = ", ".join(labels)
        title = f"ustack {command} {what}" if what != command else f"ustack {command}"
    if weight is not None:
        title += f" --weight {weight.expr}"
    return ReportContext(command=command, events=tuple(labels), frequency=frequency,
                         title=title, start_ns=start_ns,
                         value_unit=value_unit, weight=weight)


def weight_of(context):
    """The Weight a report's counts sum (probes.weight), or None."""
    return getattr(context, "weight", None)


FORMATS = _Registry({                 # counted stacks
    "text": "counts:CountsReport",
    "folded": "folded:FoldedReport",
    "html": "flamegraph_html:FlameGraphReport",
    "svg": "flamegraph_svg:SvgFlameGraphReport",
    "pprof": "pprof:PprofReport",
    "speedscope": "speedscope:SpeedscopeReport",
    "json": "json_stacks:JsonReport",
})

EVENT_FORMATS = _Registry({            # a stack per event
    "text": "trace:TraceReport",
    "perf-script": "perf_script:PerfScriptReport",
    "json": "json_events:JsonEventsReport",
})

# the file name's ending -> format, longest endings first when looked up
EXTENSIONS = {
    ".txt": "text",
    ".log": "text",
    ".folded": "folded",
    ".html": "html",
    ".htm": "html",
    ".svg": "svg",
    ".pb.gz": "pprof",
    ".pprof": "pprof",
    ".speedscope.json": "speedscope",
    ".json": "json",
    ".perf-script": "perf-script",
}


def format_for_path(path: str) -> str | None:
    """The format `-o path`'s name implies (its longest known ending), if any."""
    for ending in sorted(EXTENSIONS, key=len, reverse=True):
        if path.endswith(ending):
            return EXTENSIONS[ending]
    return None


def stack_report(name: str, per_pid: bool = False, offsets: bool = False,
                 context: ReportContext = ReportContext()):
    """A new report of counted stacks in format `name` (one of FORMATS)."""
    if name not in FORMATS:
        raise UstackError(f"unknown format {name!r} for counted stacks "
                          f"(one of {', '.join(FORMATS)})")
    return FORMATS[name](per_pid=per_pid, offsets=offsets, context=context)
