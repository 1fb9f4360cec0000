"""`ustack report --from DIR/`: the pprof files `--every -o DIR/` wrote
on one machine (no server needed), summed over the intervals and
processes the filters keep, as the StackCounts every counted format takes:
the same queries as `--from clickhouse://`, answered from the files.

What a file tells decides what can be asked: its interval's start
(--since/--until, as the server's rows: since inclusive, until exclusive,
on the start), the host its comments name (--host), and per sample its
pid, comm and event (--pid, --comm, --event). A file does not say the
container of its samples: --container is refused, in one line."""
from __future__ import annotations

import calendar
import os
import re
import time

from ...model import StackCount, UstackError
from ..pprof import HOST_COMMENT
from ..pprof_read import Shared, read_pprof
from .filters import Filter

# commands/every.file_name(): profile-20261127T041500.123Z.pb.gz
_FILE = re.compile(r"profile-\d{8}T\d{6}\.\d{3}Z\.pb\.gz\Z")


def is_directory_source(text: str) -> bool:
    return not text.startswith(("clickhouse://", "clickhouses://"))


def interval_files(directory: str) -> list:
    """The --every files of `directory`, in time (their names sort so)."""
    try:
        names = sorted(e.name for e in os.scandir(directory)
                       if _FILE.match(e.name) and e.is_file(follow_symlinks=False))
    except OSError as e:
        raise UstackError(f"--from {directory}: {e.strerror}") from None
    if not names:
        raise UstackError(f"--from {directory}: no pprof files of --every in it "
                          "(profile-YYYYMMDDTHHMMSS.mmmZ.pb.gz)")
    return names


def counted_stacks(directory: str, f: Filter, per_pid: bool = False) -> list:
    """The StackCounts of the files the filter keeps (pid 0 unless
    `per_pid`, as the server's answer)."""
    if f.containers:
        raise UstackError("--container: the pprof files of --every label samples by pid "
                          "and comm, not by container; --container reads clickhouse://")
    comms, pids = set(f.comms), set(f.pids)
    shared = Shared()                    # one program's frames, file after file
    out = []
    for name in interval_files(directory):
        if not _may_hold(name, f):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as file:
                data = file.read()
        except OSError as e:
            raise UstackError(f"{path}: {e.strerror}") from None
        interval = read_pprof(path, data, shared)
        if not _kept(interval, f):
            continue
        for sc in interval.counts:
            if ((comms and sc.comm not in comms) or (pids and sc.pid not in pids)
                    or (f.event and sc.event != f.event)):
                continue
            out.append(sc if per_pid else StackCount(sc.comm, 0, sc.stack, sc.count,
                                                     sc.event))
    return out


def _may_hold(name: str, f: Filter) -> bool:
    """Whether a file's interval may start within the range, by its name
    (its start to the millisecond): the files far outside are not read."""
    if f.since_ns is None and f.until_ns is None:
        return True
    stamp = name[len("profile-"):-len("Z.pb.gz")]
    seconds, ms = stamp.split(".")
    start_ms = calendar.timegm(time.strptime(seconds, "%Y%m%dT%H%M%S")) * 1000 + int(ms)
    low, high = start_ms * 1_000_000, (start_ms + 1) * 1_000_000   # the start is within
    return ((f.since_ns is None or high > f.since_ns)
            and (f.until_ns is None or low < f.until_ns))


def _kept(interval, f: Filter) -> bool:
    """The filters a whole file answers: its start in the range, its host."""
    if f.since_ns is not None and interval.start_ns < f.since_ns:
        return False
    if f.until_ns is not None and interval.start_ns >= f.until_ns:
        return False
    if f.hosts:
        hosts = {c[len(HOST_COMMENT):] for c in interval.comments
                 if c.startswith(HOST_COMMENT)}
        return bool(hosts & set(f.hosts))
    return True
