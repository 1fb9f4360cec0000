"""What `ustack trace|count|profile|funccount` do with a Session: the
header line, Ctrl-C, the report, the summary. The CLI's runner, and the
first user of the Session API."""
from __future__ import annotations

import os
import signal
import sys
import time
from io import TextIOBase

from ..model import CommEvent, UstackError
from ..options import (Options, check_frequency, check_interval, check_kernel_stacks,
                       check_stack_storage, run_options)
from ..report.formats import (EVENT_FORMATS, FORMATS, format_for_path, run_context,
                              stack_report)
from ..report.output import choose_format, open_output
from ..report.progress import Progress
from ..report.summary import write_summary
from ..session import Session


class _Signals:
    """Ctrl-C and SIGTERM end the run cleanly (report, remove probes); while
    the probes are being set up, set-up gives up and the run ends unstarted."""

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


def main(args) -> int:
    """`ustack trace|count|profile|funccount` from their parsed arguments."""
    opts = run_options(args)
    if args.cmd == "profile":
        check_frequency(args.frequency)
        opts.events = [f"profile:hz:{args.frequency}"]
    elif args.cmd == "funccount":
        if args.tid or args.comm:
            raise UstackError("funccount counts calls in the kernel per function: "
                              "it takes -p PID (or a list), not --tid or --comm")
        pattern = args.pattern
        opts.events = [pattern if pattern.startswith(("uprobe:", "u:"))
                       else "uprobe:" + pattern]
        check_interval(args.interval)
        opts.interval = args.interval
    else:
        opts.events = args.events
    if args.cmd in ("count", "profile"):
        opts.per_pid = args.per_pid or args.per_thread
        opts.per_thread = args.per_thread
        opts.offsets = args.offsets
        opts.kernel_stacks = args.kernel
        check_kernel_stacks(args.kernel, args.backend)
        check_stack_storage(args.stack_storage_size)
        opts.stack_storage = args.stack_storage_size
        opts.record = args.record
        every_options(opts, args, args.record)
        opts.weight = getattr(args, "weight", None)
        if opts.weight is not None and opts.record:
            raise UstackError("--weight sums in the report of a live run: "
                              "it is not recorded (drop --record)")
    return run(opts)


def every_options(opts: Options, args, record: str | None = None) -> None:
    """--every, --to and their settings into `opts`, refused in one line
    before anything is attached."""
    if args.every is not None or args.to:     # (its module imports only then)
        from .every import check_every, host_label, sink_request
        check_every(args.every, args.output, args.format, record, args.to)
        opts.to = sink_request(args)
        opts.host = host_label(args)
    _check_every_directory(args.every, args.output)
    opts.every = args.every


def _check_every_directory(every, path) -> None:
    """--every writes into a directory: a name with a file's ending
    (x.pb.gz, x.folded) is a file the user meant, not a directory to make."""
    if every is None or not path or path.endswith("/") or os.path.isdir(path):
        return
    if format_for_path(path) or os.path.basename(path).rpartition(".")[0]:
        raise UstackError(f"-o {path} names a file: --every writes a pprof file per "
                          "interval into a directory (-o DIR/)")


def run(opts: Options, out: TextIOBase | None = None, err: TextIOBase = sys.stderr) -> int:
    """Run `opts`; results to `out`, else to -o's file, else stdout."""
    if opts.every is not None:
        return run_every(opts, err)
    fmt = _output_format(opts)
    output = _output(opts, fmt, out)     # opened before anything is armed

    def report(session: Session, progress: Progress) -> int | None:
        with output as stream:
            stream = progress.guard(stream)
            if opts.command == "trace":
                _trace(session, stream, EVENT_FORMATS[fmt])
                return progress.seen
            if opts.command == "funccount":
                _funccount(session, stream)
                return None
            return _count(session, stream, fmt)

    try:
        return run_session(opts, report, err)[0]
    finally:
        output.discard()                 # the run failed before its report


def run_every(opts: Options, err: TextIOBase) -> int:
    """profile, count and offcpu --every: a pprof file per interval into
    -o's directory, and/or to --to's server."""
    from .every import open_every_directory, open_sink, write_every
    dir_fd = open_every_directory(opts.output_path) if opts.output_path else None
    sink = None
    try:
        sink = open_sink(opts.to, opts.per_thread)
        return run_session(opts, lambda session, _progress: write_every(
            session, dir_fd, opts.every, err, sink), err)[0]
    finally:
        if sink is not None:
            sink.close_and_say(err)
        if dir_fd is not None:
            os.close(dir_fd)


def run_session(opts: Options, body, err: TextIOBase = sys.stderr,
                session: Session | None = None) -> tuple:
    """A run's frame: open, header, Ctrl-C, `body(session, progress)` (which
    returns the number of events, or None), close, summary. Returns (exit
    status, the closed Session). `session`: an unopened one of a Session
    subclass (latency's), else a Session of `opts`."""
    session = session or Session(opts)
    session.close_in_background = True      # the prompt comes back at once
    with _Signals() as signals:
        try:
            signals.session = session       # set-up hears Ctrl-C too
            session.open()
            _header(session, err)
            session.start()                 # the command runs from here
            progress = _progress(session, err)
            session.on_piece = progress.piece
            events = body(session, progress)
            progress.finish()
            losses = session.losses()
        finally:
            session.close()
    target = session.target
    write_summary(err, warnings=session.warnings, losses=losses,
                  notes=session.capture.end_notes(),
                  backend=session.plan.backend,
                  buffer_pages=session.capture.buffer_pages,
                  stack_storage=opts.stack_storage,
                  command=target.argv[0] if target.scope == "command" else "",
                  exit_status=None if target.interrupted else target.exit_status,
                  events=events,
                  copied_stacks=(session.plan.backend == "perf"
                                 and "dwarf" in session.plan.modes))
    if session.plan.note:
        print(f"note: {session.plan.note}", file=err)
    if target.scope == "command" and target.interrupted:
        # -d or Ctrl-C: the command did not end on its own, ustack ended it
        print(f"{target.argv[0]} (PID {target.pid}) was ended with the run", file=err)
    return _exit_status(target), session


def _exit_status(target) -> int:
    """A -c command's own status when it failed on its own (as `time` and
    `perf stat` return it; 128+N for a signal), else 0."""
    status = target.exit_status if target.scope == "command" else None
    if not status or target.interrupted:
        return 0
    return status if status > 0 else 128 - status


def _output_format(opts: Options) -> str:
    """The format asked for, checked before anything is started or
    attached."""
    if opts.runs_as == "funccount":
        fmt = "text"
    else:
        table = EVENT_FORMATS if opts.runs_as == "trace" else FORMATS
        fmt = choose_format(opts.output_format, opts.output_path, table)
    return fmt


def _output(opts: Options, fmt: str, out: TextIOBase | None):
    if out is not None:
        return _given(out)
    binary = getattr(FORMATS.get(fmt), "binary", False) and opts.runs_as != "trace"
    return open_output(opts.output_path, binary=binary)


class _given:
    """A stream the caller gave: used, not closed."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        return False

    def discard(self) -> None:
        pass


def _progress(session: Session, err: TextIOBase) -> Progress:
    """The live status line: on a terminal, for runs whose results do not
    scroll on that terminal themselves (counts, or -o)."""
    opts = session.opts
    live = (err.isatty() and opts.runs_as != "funccount" and
            (opts.runs_as != "trace" or opts.output_path not in (None, "-")))
    return Progress(err, live, session.capture.losses,
                    counted_in_kernel=(session.plan.backend == "bpf"
                                       and opts.runs_as != "trace"))


def _count(session: Session, out, fmt: str) -> int:
    """Counted stacks in format `fmt`; returns the number of events."""
    opts = session.opts
    frequency = session.probes[0].hz if opts.runs_as == "profile" else None
    weight = session.weight
    context = run_context(opts.runs_as, session.labels, frequency, session.started_ns,
                          weight=weight)
    report = stack_report(fmt, opts.per_pid, opts.offsets, context)
    events = 0
    for counted in session.counts():
        report.add(counted)
        # a weighted count is a sum: stacks tell whether any event came
        events += counted.count if weight is None else 1
    report.finish(out)
    return events


def _jit_hint(session: Session) -> str:
    """-p of a JVM or node that wrote no perf map: how to get one."""
    if session.target.scope != "pid":
        return ""
    from ..symbols.perfmap import header_hint
    pid = session.target.pid
    # a JVM's copied stacks are walked through its Java frames (hotspot_live.py)
    java_walked = session.opts.java_walked and session.plan.unwind == "dwarf"
    # where the kernel pass walks JS frames they are named from node's heap
    return header_hint(pid, session.tracker.current_maps(pid), java_walked,
                       js_named=session.names.active("js") is not None)


def _header(session: Session, err: TextIOBase) -> None:
    labels = ", ".join(session.labels[:3])
    if len(session.labels) > 3:
        labels += f", … ({len(session.labels)} events)"
    every = session.opts.every
    note = "; ".join(n for n in (session.capture.unwind_note,
                                 getattr(session.capture, "reach_note", ""),
                                 _without_root(session.plan), _jit_hint(session),
                                 every and session.opts.output_path
                                 and f"a pprof file every {every:g} s into "
                                     f"{session.opts.output_path}",
                                 every and session.opts.to
                                 and f"every {every:g} s to {session.opts.to.address}")
                     if n)
    print(f"Tracing {labels} in {session.target.description} "
          f"[backend {session.plan.backend}, unwind {session.plan.unwind}"
          f"{'; ' + note if note else ''}]{_written(session.opts)}"
          + ("" if session.opts.duration else "... Hit Ctrl-C to end."),
          file=err, flush=True)


def _written(opts) -> str:
    """What the header says -o gets: the format, chosen (and checked)
    before the run from -f or the name's ending."""
    path = opts.output_path
    if path in (None, "-") or opts.every is not None:
        return ""
    fmt = opts.output_format or format_for_path(path) or "text"
    return f", writing {fmt} to {path}"


def _without_root(plan) -> str:
    """What the header says of a run without root: what it sees, and where
    its cache is (the user's own)."""
    if not plan.user_only:
        return ""
    from ..objfile.cache import cache_root
    return f"without root: user space only, cache {cache_root()}"


def _trace(session: Session, out: TextIOBase, report_class) -> None:
    report = report_class(out, session.labels)
    if hasattr(report, "ns_of"):         # text: a container's own pids too
        report.ns_of = session.tracker.ns_id
    # the hot loop: Session.events_of() without an Event per sample
    add, stacks, comm_of = report.add, session.resolver.stacks, session.tracker.comm_at
    add_all = getattr(report, "add_all", None)
    for piece in session.pieces():
        if any(isinstance(m, CommEvent) for m in piece.metas):
            # a thread was renamed (or exec'd): its events on either side
            # of it in this piece carry different names, so each is asked
            for sample, stack in zip(piece.samples, stacks(piece.samples)):
                report.renamed()
                add(sample, stack, comm_of)
            report.renamed()
        elif add_all is not None:
            add_all(piece.samples, stacks(piece.samples), comm_of)
        else:
            for sample, stack in zip(piece.samples, stacks(piece.samples)):
                add(sample, stack, comm_of)
        report.flush()


def _funccount(session: Session, out: TextIOBase) -> None:
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
    from ..report.funccount import format_calls
    return format_calls(totals.items())
