"""`ustack profile --every SECONDS -o DIR/`: continuous profiling, one
pprof file per interval in DIR (what Pyroscope, Parca and Grafana take
in), named by the interval's start in UTC so the names sort in time, each
written whole through output.py. A file holds the samples taken in its
interval, by their kernel timestamps (counting/intervals.py), and its
time and duration are that interval's; a last one cut short says so.
Each file says in its comments what ustack itself cost over its interval
(CPU, memory): the profiler's own weight is on record beside what it
measured."""
from __future__ import annotations

import io
import os
import resource
import time

from ..model import UstackError
from ..output import make_directory, open_directory, write_bytes_at
from ..report.formats import run_context
from ..values import replace, value

OFFCPU_LABEL = "offcpu"         # offcpu's one event, in every output

_PAGE = os.sysconf("SC_PAGE_SIZE")
HOST_LABEL_ENV = "USTACK_HOST_LABEL"


@value
class SinkRequest:
    """--to and its settings, checked before anything is attached."""
    address: str
    ca: str | None                   # --ca: the CA file of clickhouses://
    host: str
    queue: str
    queue_bytes: int


def host_label(args) -> str:
    """This machine's name in its rows and files: --host-label, else
    $USTACK_HOST_LABEL, else the hostname."""
    host = (getattr(args, "host_label", None) or os.environ.get(HOST_LABEL_ENV)
            or os.uname().nodename)
    if not host or any(c in host for c in "/\n\0"):
        raise UstackError(f"--host-label {host!r}: a name without / or newlines")
    return host


def sink_request(args) -> SinkRequest | None:
    """--to's request, or None; a wrong address is refused here."""
    to = getattr(args, "to", None)
    if not to:
        return None
    if not to.startswith(("clickhouse://", "clickhouses://")):
        raise UstackError(f"--to {to}: ustack sends to clickhouse://HOST:PORT/DB "
                          "(clickhouses:// for HTTPS)")
    from ..report.sinks.clickhouse_http import Server
    server = Server(to, ca=args.ca)      # its one-line refusals
    host = host_label(args)
    if args.queue_size <= 0:
        raise UstackError("--queue-size must be a positive number of MiB")
    queue = args.queue or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
        "ustack", "clickhouse", host)
    return SinkRequest(server.address, args.ca, host, queue,
                       int(args.queue_size * (1 << 20)))


def open_sink(request: SinkRequest | None, per_thread: bool):
    """The ClickHouse sink of --to (its sender running), or None."""
    if request is None:
        return None
    from ..report.sinks.clickhouse_http import Server
    from ..report.sinks.clickhouse_sink import ClickHouseSink
    from ..report.sinks.spool import Spool
    return ClickHouseSink(Server(request.address, ca=request.ca), Spool(request.queue, request.queue_bytes),
                          request.host, per_thread)


def check_every(seconds: float | None, output: str | None, fmt: str | None,
                record: str | None, to: str | None = None) -> None:
    """--every's one-line refusals, before anything is attached."""
    if seconds is None:
        if to:
            raise UstackError("--to sends each interval of --every SECONDS: give --every")
        return
    if seconds <= 0:
        raise UstackError("--every must be a positive number of seconds")
    if to and not output:
        return                       # the intervals go to the server only
    if not output or output == "-":
        raise UstackError("--every writes a pprof file per interval: name their "
                          "directory with -o DIR/")
    if fmt not in (None, "pprof"):
        raise UstackError(f"--every writes pprof files, not {fmt}")
    if record:
        raise UstackError("--every writes pprof files; it is not recorded (drop --record)")


def open_every_directory(path: str) -> int:
    """A descriptor of -o's directory, made when it does not exist; never
    a link, nor another user's."""
    label = f"-o {path}"
    target = path.rstrip("/") or "/"
    if os.path.lexists(target):
        if not os.path.isdir(target) or os.path.islink(target):
            raise UstackError(f"{label} is not a directory: --every writes a file "
                              "per interval into one")
        fd = open_directory(target, label, nofollow=True)
        owner = os.fstat(fd).st_uid
        if owner not in (os.geteuid(), 0):    # its owner could swap the files under us
            os.close(fd)
            raise UstackError(f"{label} is a directory of another user (uid {owner}); "
                              "name a directory of yours")
        return fd
    return make_directory(target, label)


class _OwnCost:
    """ustack's own CPU time and memory, interval by interval."""

    def __init__(self):
        self._cpu = self._cpu_now()

    @staticmethod
    def _cpu_now() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def since_last(self, seconds: float) -> tuple:
        """Comment lines on the CPU used since the last call, over `seconds`."""
        now = self._cpu_now()
        cpu, self._cpu = now - self._cpu, now
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * _PAGE >> 20
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
        share = 100 * cpu / seconds if seconds > 0 else 0.0
        cpus = os.cpu_count() or 1
        return (f"ustack's own CPU: {cpu:.3f} s over {seconds:.3f} s ({share:.2f} % of one "
                f"CPU, {share / cpus:.2f} % of the machine's {cpus})",
                f"ustack's memory: {resident} MB resident, at most {peak} MB")


def file_name(start_ns: int) -> str:
    """profile-20261127T041500.123Z.pb.gz: the interval's start, UTC."""
    seconds, ns = divmod(start_ns, 1_000_000_000)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(seconds))
    return f"profile-{stamp}.{ns // 1_000_000:03d}Z.pb.gz"


def write_every(session, dir_fd: int | None, seconds: float, err=None, sink=None) -> int:
    """A pprof file per interval of `seconds` (the last one when the run
    ends, however short; a partial one said on `err` too); returns the
    number of samples written. `sink` (--to) takes each interval's counts
    too; `dir_fd` None: no files. A file's
    time and duration are its interval's bounds, within which every one of
    its samples was taken (by the kernel's timestamps)."""
    from ..report.pprof import HOST_COMMENT, PprofReport   # here: other runs skip it
    opts = session.opts
    base = run_context(opts.command, session.labels, getattr(session.probes[0], "hz", None))
    if opts.command == "offcpu":         # its weight is time off the CPU, its event offcpu
        session.labels = [OFFCPU_LABEL] * len(session.labels)
        base = run_context("offcpu", [OFFCPU_LABEL], value_unit="nanoseconds")
    cost = _OwnCost()
    # the samples' clock (CLOCK_MONOTONIC) to the wall clock pprof keeps
    to_wall_ns = time.time_ns() - time.monotonic_ns()
    written = time.monotonic()
    samples = 0
    if sink is not None:
        session.resolver.symbolizer.on_named = sink.named
    for interval in session.interval_counts(seconds):
        start_ns = to_wall_ns + int(interval.start * 1e9)
        duration_ns = int((interval.end - interval.start) * 1e9)
        now = time.monotonic()
        comments = cost.since_last(now - written)
        if opts.host:
            comments = (f"{HOST_COMMENT}{opts.host}",) + comments
        partial = interval.partial and (f"a partial interval: {duration_ns / 1e9:.3f} s "
                                        f"of {seconds:g} s, the run ended "
                                        f"({_why_ended(session)})")
        if partial:
            comments += (partial,)
        context = replace(base, start_ns=start_ns, duration_ns=duration_ns,
                          comments=comments)
        if sink is not None:
            sink.put(start_ns, duration_ns, interval.counts,
                     session.resolver.symbolizer.copied_from)
        samples += sum(counted.count for counted in interval.counts)
        if dir_fd is None:
            written = now
            continue
        report = PprofReport(opts.per_pid, opts.offsets, context)
        for counted in interval.counts:
            report.add(counted)
        data = io.BytesIO()
        report.finish(data)
        try:
            write_bytes_at(dir_fd, file_name(start_ns), [data.getvalue()], mode=0o666)
        except OSError as e:
            raise UstackError(f"-o {opts.output_path}: {e.strerror}") from None
        if partial and err is not None:
            print(f"{file_name(start_ns)}: {partial}", file=err)
        written = now
    return samples


def _why_ended(session) -> str:
    if session.interrupt.requested:
        return "interrupted"
    if session.deadline is not None and session.stream.stopped_at >= session.deadline:
        return "-d"
    return "the traced processes exited"
