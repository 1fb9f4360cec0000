"""What `ustack record`, `report` and `archive` do: save a run now, render
it later (after the process exited, the binary was rebuilt, or on another
machine), the way `perf record` / `perf report` / `perf archive` do.
`count --record` and `profile --record` are commands.run with
Options.record set: the Session saves while it counts."""
from __future__ import annotations

import os
import sys
from typing import NamedTuple
from io import TextIOBase

from .run import run_session
from ..model import CommEvent, UstackError
from ..defaults import DEFAULT_PROFILE_HZ, DEFAULT_RECORDING, REPORT_DEBUGINFOD_WAIT_S
from ..options import (Options, check_frequency, check_stack_storage, run_options,
                       symbol_options)
from ..report.diff import diff_report_class, diff_rows, write_diff
from ..recording.archive import copy_objects
from ..report.formats import EVENT_FORMATS, FORMATS, ReportContext, run_context
from ..report.output import choose_format, open_output
from ..report.sinks.filters import id_set
from ..report.summary import write_summary
from ..session import Session
from ..target.sample_filter import SampleFilter
from ..values import replace, value

ARCHIVE_SUFFIX = ".objects"          # record --archive: FILE.objects/ beside FILE


def archive_dir(recording: str) -> str:
    """Where `record --archive` puts the objects of `recording`, and where
    `report` looks for them without being told."""
    return recording + ARCHIVE_SUFFIX


def main(args) -> int:
    """`ustack record|report|archive` from their parsed arguments."""
    if args.cmd == "record":
        return record(record_options(args), archive=args.archive)
    recording = args.recording or DEFAULT_RECORDING
    if args.cmd == "archive":
        return archive_command(recording, args.output)
    request = ReportRequest(
        recording, args.format, args.output, tuple(args.objects),
        SampleFilter(id_set(args.pid, "pid"), id_set(args.tid, "tid"),
                     frozenset(c for c in (args.comm or "").split(",") if c)),
        args.per_pid, args.offsets, args.render_as)
    opts = Options(symbols=symbol_options(args))
    if args.diff:
        if args.recording:
            raise UstackError("--diff takes the two recordings; give no FILE beside it")
        before, after = args.diff
        return report_diff(ReportRequest(after, args.format, args.output,
                                         request.objects, request.only,
                                         args.per_pid, args.offsets),
                           before, opts, lines=args.diff_lines)
    return report(request, opts)


# -- record ------------------------------------------------------------------------

def record_options(args) -> Options:
    """The checked Options of `ustack record`: -o is the recording, not a
    report."""
    opts = run_options(args)
    events = list(args.events)
    # no EVENT: a profile, at profile's own default rate
    frequency = args.frequency if args.frequency is not None or events else DEFAULT_PROFILE_HZ
    if frequency is not None:
        check_frequency(frequency)
        events.append(f"profile:hz:{frequency}")
    opts.events = events
    opts.record = args.output
    opts.output_path = None
    opts.raw_stacks = args.raw_stacks     # (plan.plan then copies stacks)
    opts.kernel_stacks = args.kernel
    check_stack_storage(args.stack_storage_size)
    opts.stack_storage = args.stack_storage_size
    return opts



def record(opts: Options, archive: bool = False, err: TextIOBase = sys.stderr) -> int:
    """Run like trace (or like count when the kernel counts), saving the
    stream unsymbolized to opts.record; nothing on stdout."""
    if archive:
        check_new_directory(archive_dir(opts.record))

    writers = []

    def drain(session: Session, progress) -> int:
        writers.append(session.recorder.writer)
        session.run_through()
        return session.recorder.writer.events

    status, session = run_session(opts, drain, err)
    writer = writers[0]
    what = ("hits counted" if session.plan.backend == "bpf" and opts.runs_as != "trace"
            else "events")
    print(f"Recorded {writer.events} {what} ({writer.stacks} distinct stacks) "
          f"in {opts.record}, {_size(os.path.getsize(opts.record))}", file=err)
    if archive:
        archive_command(opts.record, err=err)
    return status


def archive_command(path: str, directory: str | None = None,
                    err: TextIOBase = sys.stderr) -> int:
    """`ustack archive` and `record --archive`: make the archive, say what
    it holds."""
    made = make_archive(path, directory)
    for warning in made.warnings:
        print(f"ustack: {warning}", file=err)
    print(f"Archived {len(made.files)} files for {path} in {made.directory}, "
          f"{_size(made.size)}", file=err)
    return 0


def _size(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


# -- report ------------------------------------------------------------------------

@value
class ReportRequest:
    """What `ustack report` was asked: the CLI fills it in."""
    path: str
    format: str | None = None        # -f; else from -o's name, else the recorded command's
    output: str | None = None        # -o
    objects: tuple = ()                 # --objects DIR…
    only: SampleFilter = SampleFilter()
    per_pid: bool = False
    offsets: bool = False
    render_as: str | None = None     # --as count | trace; else as recorded


def replay_options(request: ReportRequest, opts: Options) -> tuple:
    """(Options, objects directories) of a replay: the recording's archive
    (FILE.objects/, when there) serves as objects and debug directory."""
    objects, debug_dirs = list(request.objects), list(opts.symbols.debug_dirs)
    archived = archive_dir(request.path)
    if os.path.isdir(archived):
        objects.append(archived)
        debug_dirs.append(archived)
    # a recording is named after its run: a debug file its run could not
    # fetch in time is waited for now
    symbols = replace(opts.symbols, debug_dirs=tuple(debug_dirs),
                      fetch_wait_s=REPORT_DEBUGINFOD_WAIT_S)
    return Options(symbols=symbols), tuple(objects)


def counted_by_default(header: dict) -> bool:
    """A recording of count/profile (or of timed samples only) reads as
    counted stacks; one of `record`/trace as a stack per event."""
    if header.get("command") in ("count", "profile"):
        return True
    labels = header.get("labels") or []
    return bool(labels) and all(label.startswith("profile:") for label in labels)


def report(request: ReportRequest, opts: Options, out_err: TextIOBase = sys.stderr) -> int:
    replay_opts, objects = replay_options(request, opts)
    session = Session.replay(request.path, replay_opts, objects,
                             keep=request.only or None)
    try:
        session.open()
        header = session.capture.header
        table, name = _report_format(header, request)
        if table is FORMATS:
            report_class = FORMATS[name]
            binary = getattr(report_class, "binary", False)
            with open_output(request.output, binary=binary) as out:
                fmt = report_class(per_pid=request.per_pid, offsets=request.offsets,
                                   context=report_context(header, session.labels))
                for counted in session.counts():
                    fmt.add(counted)
                fmt.finish(out)
        else:
            with open_output(request.output) as out:
                _events(session, EVENT_FORMATS[name](out, session.labels))
        losses = session.losses()
    finally:
        session.close()
    write_summary(out_err, warnings=session.capture.warnings + session.resolver.warnings,
                  losses=losses, backend=header.get("backend", ""),
                  buffer_pages=header.get("buffer_pages", 0),
                  stack_storage=header.get("stack_storage", 0))
    return 0


def _report_format(header: dict, request: ReportRequest) -> tuple:
    """(FORMATS or EVENT_FORMATS, name): -f, else -o's ending, else what
    the recorded command showed; a name in both tables (text) means the
    table of --as, else of the recorded command."""
    counted = (request.render_as == "count" if request.render_as
               else counted_by_default(header))
    primary, other = ((FORMATS, EVENT_FORMATS) if counted
                      else (EVENT_FORMATS, FORMATS))
    name = choose_format(request.format, request.output, {**other, **primary})
    table = primary if name in primary else other
    if (table is EVENT_FORMATS and header.get("backend") == "bpf"
            and header.get("command") != "trace"):     # trace's ring: events
        raise UstackError(f"{request.path} holds stacks counted in the kernel "
                          "(--backend bpf), not events: use a counted format "
                          f"({', '.join(FORMATS)})")
    return table, name


def report_context(header: dict, labels) -> ReportContext:
    """What the live run's formats were told, from the recording's header."""
    freqs = {int(label.split(":")[-1]) for label in labels
             if label.startswith("profile:hz:") and label.split(":")[-1].isdigit()}
    return run_context(header.get("command", "count"), labels,
                       freqs.pop() if len(freqs) == 1 else None, header.get("start_ns"))


def _events(session: Session, fmt) -> None:
    """A stack per event, as `trace` writes them (commands._trace's loop)."""
    add, stack, comm_of = fmt.add, session.resolver.stack, session.tracker.comm_at
    for piece in session.pieces():
        renamed = any(isinstance(m, CommEvent) for m in piece.metas)
        for sample in piece.samples:
            if renamed:                  # names either side of it differ
                fmt.renamed()
            add(sample, stack(sample), comm_of)
        if renamed:
            fmt.renamed()
        fmt.flush()


# -- report --diff -----------------------------------------------------------------

def replay_counts(path: str, opts: Options, objects=(), keep=None) -> tuple:
    """(StackCounts, warnings, ReportContext) of one recording."""
    with Session.replay(path, opts, objects, keep=keep) as session:
        counts = session.counts()
        warnings = session.capture.warnings + session.resolver.warnings
        context = report_context(session.capture.header, session.labels)
    return counts, warnings, context


def report_diff(request: ReportRequest, before_path: str, opts: Options,
                err: TextIOBase = sys.stderr, lines: bool = False) -> int:
    """The differential flame graph of two recordings, Python frames by
    function (`lines`: by line, --diff-lines)."""
    # the differential graph exists as a page only: -f folded or -o x.svg
    # would otherwise get HTML under their name
    choose_format(request.format, request.output, {"html": None}, default="html")
    report_class = diff_report_class()
    sides = []
    warnings: list = []
    for path in (before_path, request.path):
        side_request = ReportRequest(path, objects=request.objects)
        replay_opts, objects = replay_options(side_request, opts)
        counts, said, context = replay_counts(path, replay_opts, objects,
                                              request.only or None)
        sides.append(counts)
        warnings += said
    rows = diff_rows(sides[0], sides[1], request.per_pid, request.offsets)
    fmt = report_class(per_pid=request.per_pid, offsets=request.offsets,
                       context=context, lines=lines)   # the second run's (B's widths)
    write_diff(fmt, rows, request.output, getattr(report_class, "binary", False))
    write_summary(err, warnings=warnings)
    return 0


# -- archive -----------------------------------------------------------------------

class Archive(NamedTuple):
    directory: str
    files: list                         # paths written
    size: int                           # bytes
    warnings: list


def touched_objects(path: str) -> tuple:
    """(the files the recording's stacks have frames in, as {recorded path:
    (file to copy, recorded build-id)}, warnings): every stack unwound (not
    named) and its addresses looked up in the recorded mappings."""
    files: dict = {}
    with Session.replay(path) as session:
        keys: set = set()
        key = session.resolver.key
        for piece in session.pieces():
            keys.update(key(s) for s in piece.samples)
        keys.update(key(s) for s, _n in session.capture.counted())
        tracker, unwind_key = session.tracker, session.resolver.unwinder.unwind_key
        recorded = session.capture.recorded_build_ids
        for pid, generation, skey, _kernel in keys:
            def find(p, addr, gen=generation):
                return tracker.find(p, addr, gen)
            addrs, _notes = unwind_key(pid, skey, find)
            for addr in addrs:
                m = tracker.find(pid, addr, generation)
                if m is not None and m.path.startswith("/") and m.open_path != os.devnull:
                    files.setdefault(m.path, (m.open_path, recorded.get(
                        (m.path, m.open_path), "")))
        warnings = list(session.capture.warnings)
    return files, warnings


def make_archive(path: str, directory: str | None = None) -> Archive:
    """Copy what `report` needs to name the stacks of recording `path`
    elsewhere into `directory` (default FILE.objects/, which must not
    exist yet): each object its stacks touch that proves to be the one
    recorded, and its separate debug file when this host has one.
    Objects are found again by build-id, so names never clash badly."""
    directory = directory or archive_dir(path)
    check_new_directory(directory)          # before the recording is read
    files, warnings = touched_objects(path)
    written, size, refused = copy_objects(files, directory)
    return Archive(directory, written, size, warnings + refused)


def check_new_directory(directory: str) -> None:
    """The archive goes into a directory ustack makes: refuse one that is
    there already (it may hold planted links), before a run, not after."""
    if os.path.lexists(directory):
        raise UstackError(f"{directory} exists already: remove it or name "
                          "another directory")
