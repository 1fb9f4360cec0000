"""One run, wired: parse and resolve the probes, start or attach the
target, plan the backend, open the capture; then the stream of pieces
(metadata applied to the mapping tracker, samples passed on) until the
target exits, the duration ends or stop() is called; then clean up. Also
the public entry for scripts (see README, "Python API")."""
from __future__ import annotations

import functools
import os
import time

from .capture.backends import new_capture
from .capture.closer import close_capture
from .capture.stream import Stream
from .interrupt import Interrupt, Interrupted, heard
from .model import Event, Losses, Piece
from .options import Options, check_target
from .probes.events import resolve_probes
from .probes.spec import parse_event
from .target import ahead, process
from .target.mappings import MappingTracker
from .target.sample_filter import SampleFilter
from .symbols.runtime_names import RuntimeNames
from . import plan as policy
from . import unprivileged

POLL_S = 0.1                       # how often the run checks its end
SLICE_S = 0.05                     # decoding time between two pieces' checks
STOPPED_GRACE_S = 0.3              # asked to end: a -c command's time to end at SIGINT
STOP_S = 0.3                       # asked to end: decoding time left for what was sent
_TICK = Piece((), ())              # a step with nothing in it: time passed


class Session:
    """`with Session(Options(...)) as s:` then `s.events()` or `s.counts()`."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.tracker = MappingTracker()
        self.probes: list = []
        self.labels: list = []
        self.target = self.plan = self.capture = None
        self.guardian = None               # kernel/guardian.py, for a live run
        self.stream: Stream | None = None  # from start() on
        self._stop_requested = False
        self.interrupt = Interrupt()        # heard by set-up too (see stop())
        self.close_in_background = False   # many probes closed by capture/closer.py: the CLI's choice
        self._closed = False
        self.on_piece = None           # called with each piece (e.g. a status line)
        self.notes: list = []          # set-up's warnings (functions a glob skipped)
        self.started_ns: int | None = None     # wall clock at open()
        self.live_since: float | None = None     # time.monotonic() when the events went live
        self.recorder = None               # opts.record: recording.writer's Recorder (Pending at set-up)
        self.recording = None              # Session.replay: a recording.reader.RecordedCapture
        self.whole = False                # the stream ran to its end
        self.deadline: float | None = None    # time.monotonic() when -d ends the events
        # the runtimes' names tables (code objects', JS functions', PHP
        # functions', Perl subs', Ruby iseqs'): the capture fills, the
        # resolver names; each made as the run meets its runtime
        self.names = RuntimeNames()
        self.weight = None                 # count --weight: probes.weight.Weight
        # which samples to keep (sample, comm) -> bool; None: all
        self.keep = SampleFilter(frozenset(opts.pids), frozenset(opts.tids),
                                 frozenset(opts.comms)) or None

    @property
    def python_code(self):
        """The run's PythonCode (symbols/python.py), made if it is not yet."""
        return self.names.python_code

    @property
    def v8_functions(self):
        return self.names.v8_functions

    @property
    def php_functions(self):
        return self.names.php_functions

    @property
    def perl_subs(self):
        return self.names.perl_subs

    @property
    def ruby_iseqs(self):
        return self.names.ruby_iseqs

    @functools.cached_property
    def resolver(self):
        """Stacks from samples (unwinding, names): built at first use, so
        symbolization's imports (~20 ms) come after the probes are live."""
        from .symbols.stacks import StackResolver
        return StackResolver(self.tracker, self.opts.symbols,
                             getattr(self.capture, "cut_advice", None),
                             fp_advice=self.plan and self.plan.fp_advice(), names=self.names)

    # -- the run's lifetime ---------------------------------------------------
    def __enter__(self) -> "Session":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        if self.recording is not None:
            return self._open_recording()
        try:
            with heard(self.interrupt):     # waits deep in set-up hear Ctrl-C too
                self._set_up()
        except BaseException:
            recorder, self.recorder = self.recorder, None
            if recorder is not None:        # its file, opened first: nothing stays
                recorder.discard()
            raise

    def _set_up(self) -> None:
        opts = self.opts
        self.started_ns = time.time_ns()
        specs = [parse_event(e) for e in opts.events]
        if opts.weight is not None:     # count --weight (a trace imports none of it)
            from .probes.weight import weigh_specs
            specs = weigh_specs(specs, opts.weight)
        if opts.record:       # opened before anything is armed: refusals come first
            from .recording.writer import PendingRecording
            self.recorder = PendingRecording(opts.record)
        check_target(opts.pid, opts.cmdline)
        unprivileged.check(opts, specs)
        if opts.pid is not None:
            self.target = process.attach(opts.pid)
        if opts.container_pid is not None:
            process.attach(opts.container_pid)
        root_pid = opts.container_pid if opts.container_pid is not None else opts.pid
        self.probes = resolve_probes(specs, root_pid, self.notes, opts.unsafe_address,
                                     self.interrupt)
        if opts.weight is not None:
            from .probes.weight import weigh_probes
            self.probes, self.weight = weigh_probes(self.probes, opts.weight)
        self.interrupt.check()
        self.labels = [p.label for p in self.probes]
        if opts.backend == "tracefs" and not opts.every_process:
            from .capture.tracefs import refuse_shared_globs
            refuse_shared_globs(self.probes, opts.pid, opts.cmdline)
        if opts.pid is None:
            self.target = policy.launch_target(opts)
        ahead.prepare(self.target, self.tracker, opts.symbols)   # while the capture opens
        try:
            # before any probe exists: it undoes the run if ustack is killed
            from .kernel import guardian
            self.guardian = guardian.start(
                self.target.pid if self.target.scope == "command" else None)
            self.capture = self._open_capture()
            self.live_since = time.monotonic()     # -d and intervals count from here
            self.interrupt.check()         # asked to end: the command never runs
        except BaseException as e:
            self.target.abort()            # a held -c command exits unrun
            if isinstance(e, Interrupted):
                self.close()               # else the capture closed itself
            self._dismiss_guardian()       # (close() hands it to a closer)
            raise
        self.tracker.seed_target(self.target, skip=os.getpid())
        if opts.record:
            self.recorder = self.recorder.begin(self)

    def _open_recording(self) -> None:
        """Session.replay: the recording's header, not the kernel (nor this host's pids)."""
        self.tracker.live = self.names.live = False
        capture = self.capture = self.recording
        capture.python_code = self.python_code      # the recorded code objects' names
        capture.script_names = self.script_names()  # the recorded frames' names
        capture.open()
        self.labels = list(capture.labels)
        self.plan = policy.Plan("recording", capture.modes)
        self.target = process.recording(capture.path)

    def script_names(self) -> dict:
        """The run's names tables of interpreter frames whose words a
        capture's kernel pass or ustack's walk of a JVM's copied stacks
        writes, by kind (a recording lists them)."""
        return {"ruby": self.ruby_iseqs, "php": self.php_functions,
                "perl": self.perl_subs, "js": self.v8_functions,
                "java": self.names.get("java")}

    def _open_capture(self):
        """Plan the run and open its capture (a command with captures of
        its own, as latency, overrides this)."""
        opts = self.opts
        self.plan = policy.plan(opts.runs_as, opts.backend, opts.unwind, self.probes,
                                process.main_executable(self.target), opts.kernel_stacks,
                                policy.KEEPS_COPIES if opts.raw_stacks else None)
        capture = self.capture = new_capture(
            self.plan.backend, self.probes, self.target, self.plan.modes, opts,
            self.plan.kernel_tables, self.plan.user_only)
        capture.interrupt = self.interrupt
        capture.names = self.names
        capture.mappings = self.tracker
        if opts.python:
            self.wire_python(capture)
        capture.open()          # closes what it opened if it fails (but when interrupted)
        return capture

    def wire_python(self, capture) -> None:
        """Where the capture's copied stacks get their Python frames
        (unwind/python_live.wire): read with each of perf's DWARF copies,
        wired now; a BPF capture's deferred stacks, once it meets Python
        (a run that meets none imports nothing of it)."""
        def wire() -> None:
            from .unwind import python_live
            python_live.wire(capture, self.python_code, self.target, self.plan)
        if self.plan.backend == "perf":
            wire()
        else:
            capture.wire_python_frames = wire

    def losses(self) -> Losses:
        """The capture's losses, and the events dropped unread at the end."""
        return self.stream.losses() if self.stream is not None else self.capture.losses()

    @property
    def warnings(self) -> list:
        """What the user should hear at the end, one sentence each."""
        return self.notes + self.resolver.warnings

    @classmethod
    def replay(cls, path: str, opts: Options | None = None, objects=(),
               keep=None) -> "Session":
        """A Session over a recording instead of a live run: no root, no
        probes, no target. `objects`: directories of copies of the recorded
        binaries (by build-id or name; else their recorded paths, the same
        build-id); `keep(sample, comm)`: which samples to see (None: all)."""
        from .recording.reader import RecordedCapture
        session = cls(opts or Options())
        session.recording = RecordedCapture(path, objects)
        session.keep = keep or None
        return session

    def stop(self) -> None:
        """End the run at the next check (safe in a signal handler): set-up gives up
        (Interrupted); a stream reads its backlog STOP_S more (Stream.rest_within)."""
        self._stop_requested = True
        self.interrupt.request()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.stream is not None:
            self.stream.close()
        recorder, self.recorder = self.recorder, None
        try:
            if recorder is not None:    # a full disk says so here: the rest still closes
                recorder.close(self.losses(), whole=self.whole)
        finally:
            guardian = self.guardian
            if self.capture is not None and close_capture(
                    self.capture, self.close_in_background, len(self.probes),
                    guardian and guardian.finished) and guardian:
                guardian.hand_over()    # it watches the closer now
                self.guardian = None
            if self.target is not None and self.target.running_command():
                # asked to end, the run ends within a second: a command that
                # did not end at its SIGINT (Ctrl-C reached it too) is killed
                self.target.finish(STOPPED_GRACE_S if self._stop_requested
                                   else process.FINISH_GRACE_S)
            self._let_processes_go()
            self._dismiss_guardian()

    def _let_processes_go(self) -> None:
        """Close what read the run's processes live (the unwinder's readers,
        the names tables': their /proc/PID/mem), once nothing more is
        recorded: a long-lived API user runs many sessions; and stop the
        builders of objects the run never needed (objfile/builders.py)."""
        resolver = self.__dict__.get("resolver")    # made only if the run named stacks
        if resolver is not None:
            resolver.close()
        self.names.close()
        from .objfile import builders   # a head start for objects never met ends too
        builders.stop_unneeded()

    def _dismiss_guardian(self) -> None:
        if self.guardian is not None:
            self.guardian.done()
            self.guardian = None

    # -- the stream ---------------------------------------------------------------
    def start(self) -> None:
        """Let the run begin (the probes are live since open()): a held -c
        command goes on to its first instruction and the stream is read.
        pieces() starts it if nobody did; the CLI does it right after the
        header, before importing what reports and names stacks."""
        if self.stream is None:
            # -d: from when the events went live (reading /proc after included)
            self.deadline = (self.live_since + self.opts.duration
                              if self.opts.duration else None)
            excluded = self.target.excluded_pids(self.opts.include_idle)
            self.stream = Stream(self.capture, excluded, self.deadline)
            self.stream.start()

    def pieces(self):
        """Pieces of the stream, their metadata already applied; an empty
        one at least every POLL_S, so a caller can write or print."""
        self.start()
        stream, deadline = self.stream, self.deadline
        while True:
            for piece in stream.follow(POLL_S, SLICE_S):
                yield self._applied(piece)
            yield self._applied(_TICK)
            cut = self._stop_requested or (deadline is not None and
                                           time.monotonic() >= deadline)
            if cut or self.target.wait():
                break
        # ended by Ctrl-C or -d: see Stream.rest_within (a backlog read
        # within a second of Ctrl-C); a target that ended has all it sent read
        rest = (stream.rest_within(STOP_S, asked_to_end=lambda: self._stop_requested)
                if cut else stream.rest())
        for piece in rest:
            yield self._applied(piece)
        self.whole = not self.capture.counts_in_kernel    # else: once counted() is read

    def _applied(self, piece: Piece) -> Piece:
        for event in piece.metas:
            self.tracker.apply(event)
        if self.keep is not None and piece.samples:
            keep, comm = self.keep, self.tracker.comm
            piece = Piece(piece.metas, [s for s in piece.samples
                                        if keep(s, comm(s.pid, s.tid))])
        if self.on_piece is not None:
            self.on_piece(piece)
        if self.recorder is not None and piece is not _TICK:
            return self.recorder.add_piece(piece)
        return piece

    def events_of(self, piece: Piece):
        """The Events of a piece's samples, symbolized."""
        stack, comm_at, labels = self.resolver.stack, self.tracker.comm_at, self.labels
        for s in piece.samples:
            yield Event(s, labels[s.probe], comm_at(s.pid, s.tid, s.time_ns), stack(s))

    def events(self):
        """Every event of the run, with its stack, as it comes."""
        for piece in self.pieces():
            yield from self.events_of(piece)

    def counts(self) -> list:
        """Run to the end; the StackCounts of every distinct stack (with
        --weight, each count is the sum of the weights)."""
        from .counting import tally     # counting runs' (a trace names each event)
        return tally.counts(self)

    def interval_counts(self, seconds: float):
        """Run to the end, yielding every `seconds` (and once at the end)
        an Interval: the StackCounts of the samples taken in it, by their
        timestamps (see counting/intervals.py)."""
        from .counting import intervals    # profile --every, dumps: not a short run's
        return intervals.interval_counts(self, seconds)

    def run_through(self) -> None:
        """Run to the end naming nothing: what `ustack record` does (the
        Recorder saves the stream as it passes)."""
        from .counting import tally
        tally.run_through(self)
