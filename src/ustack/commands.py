"""What `ustack trace|count|profile|funccount` do with a Session: the
header line, Ctrl-C, the report, the summary. The CLI's runner, and the
first user of the Session API."""
from __future__ import annotations

import signal
import sys
import time
from typing import TextIO

from .model import CommEvent
from .options import Options
from .report.formats import stack_report
from .report.funccount import format_calls
from .report.summary import write_summary
from .report.trace import TraceReport
from .session import Session


class _Signals:
    """Ctrl-C and SIGTERM end the run cleanly (report, remove probes), even
    when they arrive while the probes are being set up."""

    def __init__(self):
        self.session = None
        self.requested = False
        self._old: dict = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True
        if self.session is not None:
            self.session.stop()

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def run(opts: Options, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    session = Session(opts)
    with _Signals() as signals:
        try:
            session.open()
            signals.session = session
            if signals.requested:
                session.stop()
            _header(session, err)
            if opts.command == "trace":
                _trace(session, out)
            elif opts.command == "funccount":
                _funccount(session, out)
            else:
                report = stack_report(opts.output_format, opts.per_pid, opts.offsets)
                for counted in session.counts():
                    report.add(counted)
                report.finish(out)
            out.flush()
            losses = session.capture.losses()
        finally:
            session.close()
    target = session.target
    write_summary(err, warnings=session.resolver.warnings, losses=losses,
                  backend=session.plan.backend,
                  buffer_pages=session.capture.buffer_pages,
                  stack_storage=opts.stack_storage,
                  command=target.argv[0] if target.scope == "command" else "",
                  exit_status=target.exit_status)
    if session.plan.note:
        print(f"note: {session.plan.note}", file=err)
    return 0


def _header(session: Session, err: TextIO) -> None:
    labels = ", ".join(session.labels[:3])
    if len(session.labels) > 3:
        labels += f", … ({len(session.labels)} events)"
    note = session.capture.unwind_note
    print(f"Tracing {labels} in {session.target.description} "
          f"[backend {session.plan.backend}, unwind {session.plan.unwind}"
          f"{'; ' + note if note else ''}]"
          + ("" if session.opts.duration else "... Hit Ctrl-C to end."),
          file=err, flush=True)


def _trace(session: Session, out: TextIO) -> None:
    report = TraceReport(out, session.labels)
    # the hot loop: Session.events_of() without an Event per sample
    add, stack, comm_of = report.add, session.resolver.stack, session.tracker.comm
    for piece in session.pieces():
        if any(isinstance(m, CommEvent) for m in piece.metas):
            report.renamed()             # a thread was renamed (or exec'd)
        for sample in piece.samples:
            add(sample, stack(sample), comm_of)
        report.flush()


def _funccount(session: Session, out: TextIO) -> None:
    interval = session.opts.interval
    next_print = time.monotonic() + interval if interval else None
    for _piece in session.pieces():
        if next_print is not None and time.monotonic() >= next_print:
            next_print += interval
            out.write(_calls_table(session, reset=True) + "\n")
            out.flush()
    out.write(_calls_table(session, reset=False))


def _calls_table(session: Session, reset: bool) -> str:
    names = [p.symbol or f"0x{p.address:x}" for p in session.probes]
    totals: dict = {}
    for name, n in zip(names, session.capture.calls(reset)):
        totals[name] = totals.get(name, 0) + n
    return format_calls(totals.items())
