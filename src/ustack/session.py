"""One run, wired: parse and resolve the probes, start or attach the
target, plan the backend, open the capture; then the stream of pieces
(metadata applied to the mapping tracker, samples passed on) until the
target exits, the duration ends or stop() is called; then clean up. Also
the public entry for scripts (see README, "Python API")."""
from __future__ import annotations

import os
import time
from typing import NamedTuple, Optional

from .capture.backends import new_capture
from .capture.drain import Stream
from .capture.recorded import RecordedCapture
from .model import Piece, RawSample, Stack, StackCount, UstackError
from .options import Options
from .probes.resolve import resolve_probes
from .probes.spec import parse_event
from .symbols.stacks import StackResolver
from .target import process
from .target.mappings import MappingTracker
from .target.traced_command import launch_traced
from .unwind import policy

POLL_S = 0.1                       # how often the run checks its end
SLICE_S = 0.05                     # decoding time between two pieces' checks
_TICK = Piece((), ())              # a step with nothing in it: time passed


class Event(NamedTuple):
    """A sample with its names: what `Session.events()` yields."""
    sample: RawSample
    label: str                     # the event, as the header shows it
    comm: str
    stack: Stack


class Session:
    """`with Session(Options(...)) as s:` then `s.events()` or `s.counts()`."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.tracker = MappingTracker()
        self.resolver = StackResolver(self.tracker, opts.symbols)
        self.probes: list = []
        self.labels: list = []
        self.target = self.plan = self.capture = None
        self._stream: Optional[Stream] = None
        self._stop_requested = False

    # -- the run's lifetime ---------------------------------------------------
    def __enter__(self) -> "Session":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        opts = self.opts
        specs = [parse_event(e) for e in opts.events]
        if opts.pid is not None and opts.cmdline:
            raise UstackError("use either -p PID or -c CMD, not both")
        if os.geteuid() != 0:
            raise UstackError("ustack needs root to open perf events and uprobes "
                              "(run it with sudo)")
        if opts.pid is not None:
            self.target = process.attach(opts.pid)
        self.probes = resolve_probes(specs, opts.pid)
        self.labels = [p.label for p in self.probes]
        if opts.pid is None:
            launch = launch_traced if opts.backend == "tracefs" else process.launch
            self.target = launch(opts.cmdline) if opts.cmdline else process.everything()
        try:
            self.plan = policy.plan(opts.command, opts.backend, opts.unwind,
                                    self.probes, self._main_binary(), opts.kernel_stacks)
            capture = new_capture(self.plan.backend, self.probes, self.target,
                                  self.plan.modes, opts, self.plan.kernel_tables)
            capture.open()                  # closes what it opened if it fails
            self.capture = capture
        except BaseException:
            self.target.abort()            # a held -c command exits unrun
            raise
        if self.target.scope == "pid":
            self.tracker.seed_from_proc(self.target.pid)

    @classmethod
    def replay(cls, path: str, opts: Optional[Options] = None, objects=()) -> "Session":
        """A Session over a recording (report/record.py wrote it) instead of
        a live run: no root, no probes, no target. `objects`: directories
        holding copies of the recorded binaries, found by build-id or name
        (else at their recorded paths, if the build-id is the same)."""
        return _Replay(path, opts or Options(), objects)

    def _main_binary(self) -> Optional[str]:
        target = self.target
        if target.scope == "pid":
            return f"/proc/{target.pid}/exe"
        return process.executable(target.argv) if target.scope == "command" else None

    def stop(self) -> None:
        """End the run at the next check (safe from a signal handler)."""
        self._stop_requested = True

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        if self.capture is not None:
            self.capture.close()
        target = self.target
        if target is not None and target.scope == "command" and target.exit_status is None:
            target.interrupt()
            target.wait(block=True)

    # -- the stream ---------------------------------------------------------------
    def pieces(self):
        """Pieces of the stream, their metadata already applied; an empty
        one at least every POLL_S, so a caller can write or print."""
        stream = self._stream = Stream(self.capture)
        deadline = (time.monotonic() + self.opts.duration if self.opts.duration
                    else None)
        stream.start()
        while True:
            for piece in stream.follow(POLL_S, SLICE_S):
                yield self._applied(piece)
            yield _TICK
            if (self._stop_requested or self.target.wait() or
                    (deadline is not None and time.monotonic() >= deadline)):
                break
        for piece in stream.rest():
            yield self._applied(piece)

    def _applied(self, piece: Piece) -> Piece:
        for event in piece.metas:
            self.tracker.apply(event)
        return piece

    def events_of(self, piece: Piece):
        """The Events of a piece's samples, symbolized."""
        stack, comm, labels = self.resolver.stack, self.tracker.comm, self.labels
        for s in piece.samples:
            yield Event(s, labels[s.probe], comm(s.pid, s.tid), stack(s))

    def events(self):
        """Every event of the run, with its stack, as it comes."""
        for piece in self.pieces():
            yield from self.events_of(piece)

    def counts(self) -> list:
        """Run to the end; the StackCounts of every distinct stack."""
        counted: dict = {}                  # (probe, tid, resolver key) -> count
        key = self.resolver.key
        for s, n in self._counted_samples():
            k = (s.probe, s.tid, key(s))
            counted[k] = counted.get(k, 0) + n
        stack_of, comm = self.resolver.stack_of, self.tracker.comm
        return [StackCount(comm(rkey[0], tid), rkey[0], stack_of(rkey), n,
                           self.labels[probe])
                for (probe, tid, rkey), n in counted.items()]

    def _counted_samples(self):
        """(sample, count): from the kernel's maps when it counted (its
        stream carries only metadata), else each sample once; frame-pointer
        stacks are keyed raw and unwound once per key at the end."""
        if self.plan.backend == "bpf":
            for _piece in self.pieces():
                pass
            yield from self.capture.counted()
            return
        for piece in self.pieces():
            for s in piece.samples:
                yield s, 1


class _Replay(Session):
    """Session.replay: open() reads a recording's header, not the kernel."""

    def __init__(self, path: str, opts: Options, objects):
        super().__init__(opts)
        self.tracker.live = False       # recorded pids are not this host's processes
        self._recording = RecordedCapture(path, objects)

    def open(self) -> None:
        capture = self._recording
        capture.open()
        self.capture = capture
        self.labels = list(capture.labels)
        self.plan = policy.Plan("recording", capture.modes)
        self.target = process.recording(capture.path)
