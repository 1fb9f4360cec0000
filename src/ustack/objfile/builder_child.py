"""What a builder child does (objfile/builders.py starts them): take the
object's lock, so that builders of one object never pile up across runs;
leave on SIGTERM as Python does, so a cache file being written is removed,
not left under its temporary name; and, for a long-lived builder, read its
jobs one a line and answer each when its cache entries are written."""
from __future__ import annotations

import json
import os
import signal
import sys
from contextlib import contextmanager

from . import builders

IDLE_S = 1.0                    # a long-lived builder with no job this long leaves


def become_builder(key: tuple) -> None:
    """What a builder child does first: it builds what it is asked, here;
    SIGTERM (builders.stop_all) ends it as SystemExit, so the files it writes are
    removed when unfinished (output.write_bytes_at); and it waits for a
    builder of another run with the same `key` (one still finishing after
    its run ended), then finds the entry built, so repeated runs on a
    busy machine never pile builders of one object up."""
    builders.in_builder = True
    signal.signal(signal.SIGTERM, _leave)
    from .cache import hold
    hold(lock_name(key))


def serve(build) -> None:
    """What a long-lived builder child does (started by builders.start(shared=True)):
    builds `build(args)` for each job read from stdin, in turn, each
    answered on stdout when done, until its pipe ends (the run is over:
    the jobs it was given are finished, for the next run) or no job came
    for IDLE_S (the run asks for its objects one after another; an API
    user's process keeps no idle builder). A job sent as it leaves finds
    it gone: its caller builds. SIGTERM ends it as become_builder's does.
    `build` takes its object's lock itself (building())."""
    import select
    builders.in_builder = True
    signal.signal(signal.SIGTERM, _leave)
    pending = b""
    while True:
        if b"\n" not in pending:
            if not select.select([0], [], [], IDLE_S)[0]:
                return
            more = os.read(0, 1 << 16)
            if not more:
                return
            pending += more
            continue
        line, pending = pending.split(b"\n", 1)
        number, args = json.loads(line)
        try:
            build(args)
        except Exception:       # noqa: BLE001 - its caller finds no entry and builds
            pass
        try:
            os.write(1, b"%d\n" % number)
        except OSError:
            pass                # the run is over: the next jobs are for the cache


@contextmanager
def building(key: tuple):
    """While a long-lived builder builds `key`: the lock become_builder()
    holds for a builder of its own (held until the job ends)."""
    from .cache import hold
    fd = hold(lock_name(key))
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def lock_name(key: tuple) -> str:
    """The name of the lock the builder of `key` holds (objfile/cache.py's
    hold())."""
    return "builder\0" + "\0".join(map(str, key))


def _leave(_signum, _frame):
    sys.exit(1)
