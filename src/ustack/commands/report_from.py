"""`ustack report --from clickhouse://HOST:PORT/DB | DIR/`: the intervals
`--every` sent to ClickHouse, or wrote as pprof files into DIR, summed
over the hosts, processes and time the filters keep, in any counted
format, or the difference of two time ranges or hosts. Imports neither
the capture nor the session: a query's wall time is mostly the server's."""
from __future__ import annotations

import sys
from io import TextIOBase

from ..model import UstackError
from ..report.diff import diff_report_class, diff_rows, write_diff
from ..report.formats import FORMATS, run_context
from ..report.output import choose_format, open_output
from ..report.sinks.filters import Filter, id_set, parse_time
from ..values import replace


def main(args) -> int:
    return report_from(args)


def report_from(args, err: TextIOBase = sys.stderr) -> int:
    """`report --from`: what --every --to sent, or what --every -o DIR/
    wrote, in any counted format, or --diff of two time ranges
    (START..END) or two hosts (host=NAME)."""
    if args.recording:
        raise UstackError(f"--from reads {args.source}; give no FILE beside it")
    counted_stacks, address = _source(args.source, args.ca)
    only = Filter(
        hosts=_names(args.host), comms=_names(args.comm),
        pids=tuple(sorted(id_set(args.pid, "pid"))),
        containers=_names(args.container),
        since_ns=parse_time(args.since, "--since") if args.since else None,
        until_ns=parse_time(args.until, "--until") if args.until else None,
        event=args.event or "")
    if args.diff:
        sides = [counted_stacks(_side(only, text), args.per_pid)
                 for text in args.diff]
        choose_format(args.format, args.output, {"html": None}, default="html")
        report_class = diff_report_class()
        labels = _event_labels(sides[0] + sides[1])
        fmt = report_class(per_pid=args.per_pid, offsets=False, lines=args.diff_lines,
                           context=_context(labels))
        rows = diff_rows(sides[0], sides[1], args.per_pid)
        write_diff(fmt, rows, args.output, getattr(report_class, "binary", False))
        return 0
    counts = counted_stacks(only, args.per_pid)
    if not counts:
        print(f"ustack: {address} holds no samples these filters keep", file=err)
    name = choose_format(args.format, args.output, FORMATS, default="text")
    report_class = FORMATS[name]
    with open_output(args.output, binary=getattr(report_class, "binary", False)) as out:
        fmt = report_class(per_pid=args.per_pid, offsets=False,
                           context=_context(_event_labels(counts)))
        for counted in counts:
            fmt.add(counted)
        fmt.finish(out)
    return 0


def _source(text: str, ca: str | None) -> tuple:
    """(counted_stacks(Filter, per_pid), the address said in messages) of
    --from's ClickHouse server or --every directory."""
    from ..report.sinks.every_source import is_directory_source
    if is_directory_source(text):
        if ca:
            raise UstackError(f"--ca {ca}: a certificate is checked over HTTPS only "
                              "(--from clickhouses://…), not in a directory")
        from ..report.sinks import every_source
        return (lambda only, per_pid: every_source.counted_stacks(text, only, per_pid),
                text)
    from ..report.sinks import clickhouse_source
    from ..report.sinks.clickhouse_http import Server
    server = Server(text, ca=ca)
    return (lambda only, per_pid: clickhouse_source.counted_stacks(server, only, per_pid),
            server.address)


def _event_labels(counts) -> list:
    """The events of the counts, in a stable order (the formats' labels)."""
    return sorted({sc.event for sc in counts})


def _names(text) -> tuple:
    return tuple(n for n in (text or "").split(",") if n)


def _side(only, text: str):
    """One side of --diff with --from: START..END, or host=NAME[,NAME]."""
    if text.startswith("host="):
        return replace(only, hosts=_names(text[len("host="):]))
    start, sep, end = text.partition("..")
    if not sep:
        raise UstackError(f"--diff {text!r}: with --from, each side is a time range "
                          "START..END or host=NAME")
    return replace(only, since_ns=parse_time(start, "--diff") if start else None,
                   until_ns=parse_time(end, "--diff") if end else None)


def _context(labels: list):
    """What the formats are told: a profile's, at its one frequency."""
    freqs = {int(label.split(":")[-1]) for label in labels
             if label.startswith("profile:hz:") and label.split(":")[-1].isdigit()}
    return run_context("profile", labels, freqs.pop() if len(freqs) == 1 else None, None)
