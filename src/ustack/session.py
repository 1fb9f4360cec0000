"""One run, wired: parse and resolve the probes, start or attach the
target, plan the backend, open the capture; then the stream of pieces
(metadata applied to the mapping tracker, samples passed on) until the
target exits, the duration ends or stop() is called; then clean up. Also
the public entry for scripts (see README, "Python API")."""
from __future__ import annotations

import functools
import os
import time
from collections import namedtuple

from .capture.backends import new_capture
from .capture.closer import BACKGROUND_PROBES, close_in_background
from .capture.stream import Stream
from .interrupt import Interrupt, Interrupted, heard
from .model import Losses, Piece, RawSample, StackCount, UstackError, unwound_sample
from .options import Options
from .probes.resolve import resolve_probes
from .probes.weight import as_s64, weigh_probes, weigh_spec
from .probes.spec import parse_event
from .output import check_destination
from .target import process
from .target.mappings import MappingTracker, ProcessMaps
from .target.sample_filter import SampleFilter
from .symbols.python import PythonCode
from .target.traced_command import launch_traced
from . import plan as policy
from . import unprivileged
from .values import fields

POLL_S = 0.1                       # how often the run checks its end
SLICE_S = 0.05                     # decoding time between two pieces' checks
STOPPED_GRACE_S = 0.3              # asked to end: a -c command's time to end at SIGINT
STOP_S = 0.3                       # asked to end: decoding time left for what was sent
MAX_NAMED_STACKS = 100_000         # interval_counts' symbolized stacks kept between refreshes
_TICK = Piece((), ())              # a step with nothing in it: time passed


class Event(namedtuple("Event", "sample label comm stack")):
    """A sample with its names: what `Session.events()` yields: the
    RawSample, the event's label as the header shows it, the comm, the
    symbolized Stack."""
    __slots__ = ()


class Session:
    """`with Session(Options(...)) as s:` then `s.events()` or `s.counts()`."""

    def __init__(self, opts: Options):
        self.opts = opts
        self.tracker = MappingTracker()
        self.probes: list = []
        self.labels: list = []
        self.target = self.plan = self.capture = None
        self.guardian = None               # kernel/guardian.py, for a live run
        self._stream: Stream | None = None
        self._stop_requested = False
        self.interrupt = Interrupt()        # heard by set-up too (see stop())
        # a capture of many probes closes in a detached process (see
        # capture/closer.py): what the CLI wants; a script may too
        self.close_in_background = False
        self._closed = False
        self.on_piece = None           # called with each piece (e.g. a status line)
        self.notes: list = []          # set-up's warnings (functions a glob skipped)
        self.jit_hint = ""             # -p of a JVM or node without a perf map: the header says
        self.started_ns: int | None = None     # wall clock at open()
        self.live_since: float | None = None     # time.monotonic() when the events went live
        self.recorder = None               # opts.record: a recording.writer.Recorder
        self._whole = False                # the stream ran to its end
        # which samples to keep (sample, comm) -> bool; None: all
        # names of Python code objects: the capture reads each as it sees
        # it, the resolver names frames with them (or a recording keeps them)
        self.python_code = PythonCode()
        self.weight = None                 # count --weight: probes.weight.Weight
        self.keep = SampleFilter(frozenset(opts.pids), frozenset(opts.tids),
                                 frozenset(opts.comms)) or None

    @functools.cached_property
    def resolver(self):
        """Stacks from samples (unwinding, names): built at first use, so
        symbolization's imports (~20 ms) come after the probes are live."""
        from .symbols.stacks import StackResolver
        return StackResolver(self.tracker, self.opts.symbols,
                             getattr(self.capture, "cut_advice", None), self.python_code,
                             self._fp_advice())

    def _fp_advice(self) -> str | None:
        """What a frame-pointer stack cut short advises; None when no probe
        of the run walks frame pointers."""
        if self.plan is None or "fp" not in self.plan.modes:
            return None
        if self.plan.backend == "tracefs":
            return "--backend bpf or perf unwind with CFI"
        return "--unwind dwarf unwinds with CFI"

    # -- the run's lifetime ---------------------------------------------------
    def __enter__(self) -> "Session":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        with heard(self.interrupt):     # waits deep in set-up hear Ctrl-C too
            self._set_up()

    def _set_up(self) -> None:
        opts = self.opts
        self.started_ns = time.time_ns()
        specs = [parse_event(e) for e in opts.events]
        if opts.weight is not None:
            specs = [weigh_spec(s, opts.weight) for s in specs]
        if opts.record:
            check_destination(opts.record, what="a recording")
        if opts.pid is not None and opts.cmdline is not None:
            raise UstackError("use either -p PID or -c CMD, not both")
        if opts.cmdline is not None and not opts.cmdline.strip():
            raise UstackError("-c needs a command (an empty one would trace "
                              "the whole system)")
        unprivileged.check(opts, specs)
        if opts.pid is not None:
            self.target = process.attach(opts.pid)
        if opts.container_pid is not None:
            process.attach(opts.container_pid)
        root_pid = opts.container_pid if opts.container_pid is not None else opts.pid
        self.probes = resolve_probes(specs, root_pid, self.notes, opts.unsafe_address,
                                     self.interrupt)
        if opts.weight is not None:
            self.probes, self.weight = weigh_probes(self.probes, opts.weight)
        self.interrupt.check()
        self.labels = [p.label for p in self.probes]
        if opts.backend == "tracefs" and not opts.every_process:
            self._refuse_shared_globs()
        if opts.pid is None:
            launch = launch_traced if opts.backend == "tracefs" or policy.held_at_exit(
                opts.command, opts.backend, opts.python, opts.cmdline) else process.launch
            self.target = (launch(opts.cmdline) if opts.cmdline is not None
                           else process.everything(opts.pids))
        if self.target.scope == "system":
            from .target import busy_objects
            busy_objects.start_building(skip=os.getpid())
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
        if self.target.scope == "system":
            self.tracker.seed_all(skip=os.getpid())
        elif self.target.scope == "pid":
            self.tracker.seed_from_proc(self.target.pid)
            from .symbols.perfmap import header_hint
            pid = self.target.pid
            self.jit_hint = header_hint(pid, self.tracker.procs.get(
                (pid, self.tracker.generations.get(pid, 0)), ProcessMaps()).maps)
        if opts.record:
            from .recording.writer import Recorder
            self.recorder = Recorder(
                opts.record, self.tracker, self.resolver.unwinder, self.labels,
                self.plan.modes, self.plan.backend,
                {"command": opts.runs_as, "events": list(opts.events),
                 "start_ns": self.started_ns,
                 "buffer_pages": self.capture.buffer_pages,
                 "stack_storage": opts.stack_storage},
                raw_stacks=opts.raw_stacks, python_code=self.python_code)

    def _open_capture(self):
        """Plan the run and open its capture (a command with captures of
        its own, as latency, overrides this)."""
        opts = self.opts
        copy_reason = policy.KEEPS_COPIES if opts.raw_stacks else None
        self.plan = policy.plan(opts.runs_as, opts.backend, opts.unwind,
                                self.probes, self._main_binary(), opts.kernel_stacks,
                                copy_reason)
        capture = self.capture = new_capture(
            self.plan.backend, self.probes, self.target, self.plan.modes, opts,
            self.plan.kernel_tables, self.plan.user_only)
        capture.interrupt = self.interrupt
        capture.python_code = self.python_code
        if opts.python and self.plan.backend == "perf" and "dwarf" in self.plan.modes:
            # the copy path: the Python frames of each sample's thread read
            # from its process (what the bpf backend's walk does in the kernel)
            from .unwind import python_live
            capture.python_frames = python_live.LiveFrames(self.python_code.remember)
            if python_live.runs_python(self.target):
                capture.unwind_note = python_live.HEADER_NOTE
        capture.open()          # closes what it opened if it fails (but when interrupted)
        return capture

    def losses(self) -> Losses:
        """The capture's losses, and the events dropped unread at the end."""
        losses = self.capture.losses()
        if self._stream is not None and self._stream.dropped_samples:
            losses = Losses(**{**{f: getattr(losses, f) for f in fields(losses)},
                               "dropped": self._stream.dropped_samples})
        return losses

    @property
    def warnings(self) -> list:
        """What the user should hear at the end, one sentence each."""
        return self.notes + self.resolver.warnings

    @classmethod
    def replay(cls, path: str, opts: Options | None = None, objects=(),
               keep=None) -> "Session":
        """A Session over a recording (recording/writer.py wrote it) instead of
        a live run: no root, no probes, no target. `objects`: directories
        holding copies of the recorded binaries, found by build-id or name
        (else at their recorded paths, if the build-id is the same).
        `keep(sample, comm)`: which samples to see (all when None)."""
        return _Replay(path, opts or Options(), objects, keep)

    def _refuse_shared_globs(self) -> None:
        """Before the command starts: see capture/tracefs.py."""
        opts = self.opts
        if opts.pid is not None:
            main, who = f"/proc/{opts.pid}/exe", f"PID {opts.pid}"
        elif opts.cmdline is not None:
            main, who = process.command_executable(opts.cmdline), "the -c command"
            if main is None:
                return                      # launch() says why
        else:
            return                          # every process is what was asked
        from .capture.tracefs import refuse_shared_globs
        refuse_shared_globs(self.probes, main, who)

    def _main_binary(self) -> str | None:
        target = self.target
        if target.scope == "pid":
            return f"/proc/{target.pid}/exe"
        return process.executable(target.argv) if target.scope == "command" else None

    def stop(self) -> None:
        """End the run at the next check (safe from a signal handler): while
        it is being set up, set-up gives up (open() raises Interrupted);
        while it runs, or reads what it sent in its -d time, what the kernel
        sent is decoded for STOP_S more, the rest dropped and counted."""
        self._stop_requested = True
        self.interrupt.request()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            self._stream.close()
        recorder, self.recorder = self.recorder, None
        try:
            if recorder is not None:    # a full disk says so here: the rest still closes
                recorder.close(self.losses(), whole=self._whole)
        finally:
            if self.capture is not None:
                capture = self.capture
                guardian = self.guardian
                if (self.close_in_background and len(self.probes) >= BACKGROUND_PROBES
                        and capture.release is not None):
                    if close_in_background(capture.close, capture.release,
                                           guardian and guardian.finished) and guardian:
                        guardian.hand_over()    # it watches the closer now
                        self.guardian = None
                else:
                    capture.close()
            target = self.target
            if target is not None and target.scope == "command" and target.exit_status is None:
                # asked to end, the run ends within a second: a command that
                # did not end at its SIGINT (Ctrl-C reached it too) is killed
                target.finish(STOPPED_GRACE_S if self._stop_requested
                              else process.FINISH_GRACE_S)
            self._dismiss_guardian()

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
        if self._stream is None:
            # -d: how long the events are live, set-up after they went live
            # (a whole machine's processes read from /proc) included
            self._deadline = (self.live_since + self.opts.duration
                              if self.opts.duration else None)
            self._stream = Stream(self.capture, self._excluded_pids(), self._deadline)
            self._stream.start()

    def pieces(self):
        """Pieces of the stream, their metadata already applied; an empty
        one at least every POLL_S, so a caller can write or print."""
        self.start()
        stream, deadline = self._stream, self._deadline
        while True:
            for piece in stream.follow(POLL_S, SLICE_S):
                yield self._applied(piece)
            yield self._applied(_TICK)
            cut = self._stop_requested or (deadline is not None and
                                           time.monotonic() >= deadline)
            if cut or self.target.wait():
                break
        # ended by Ctrl-C: a backlog is decoded for STOP_S, the rest dropped
        # and counted, so the run ends within a second however busy its
        # target. Ended by -d: what was sent in its time is all read (a cold
        # whole-machine profile's rows are built as it goes: half its samples
        # waited), unless Ctrl-C comes meanwhile. A target that ended has all
        # of what it sent read.
        rest = (stream.rest_within(STOP_S, asked_to_end=lambda: self._stop_requested)
                if cut else stream.rest())
        for piece in rest:
            yield self._applied(piece)
        self._whole = not self.capture.counts_in_kernel    # else: once counted() is read

    def _excluded_pids(self) -> frozenset:
        """A system-wide run leaves out ustack itself (tracing its own
        writes would feed back into itself) and the idle task (pid 0: no
        user stack)."""
        if self.target.scope != "system":
            return frozenset()
        return frozenset((os.getpid(),) if self.opts.include_idle else (os.getpid(), 0))

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
        stack, comm, labels = self.resolver.stack, self.tracker.comm, self.labels
        for s in piece.samples:
            yield Event(s, labels[s.probe], comm(s.pid, s.tid), stack(s))

    def events(self):
        """Every event of the run, with its stack, as it comes."""
        for piece in self.pieces():
            yield from self.events_of(piece)

    def counts(self) -> list:
        """Run to the end; the StackCounts of every distinct stack (with
        --weight, each count is the sum of the weights)."""
        counted: dict = {}                  # (probe, tid, resolver key) -> count
        self._add_counts(counted, self._counted_samples())
        return self._stack_counts(counted, self.resolver.stack_of)

    def interval_counts(self, seconds: float):
        """Run to the end, yielding every `seconds` (and once at the end)
        the StackCounts of what was counted since the last yield: a live
        view's refreshes. The kernel's counts are read and reset each time."""
        named: dict = {}                    # resolver key -> Stack, across intervals
        stack_of = self.resolver.stack_of

        def stack(rkey):
            found = named.get(rkey)
            if found is None:
                if len(named) > MAX_NAMED_STACKS:
                    named.clear()
                found = named[rkey] = stack_of(rkey)
            return found

        counted: dict = {}
        self.start()
        # counted from when the events went live, as -d is: -d 60 with 10 s
        # intervals is six of them; one due as the run ends is the last, whole
        due = self.live_since + seconds
        ending = self._deadline if self._deadline is not None else float("inf")
        settle = self.capture.settle
        for piece in self.pieces():
            self._add_counts(counted, ((settle(s, self._unwound_now), 1)
                                       for s in piece.samples))
            now = time.monotonic()
            if now >= due and now < ending:
                due = max(due + seconds, time.monotonic())
                self._add_counts(counted, self._kernel_counted(reset=True))
                yield self._stack_counts(counted, stack)
                counted = {}
        self._add_counts(counted, self._kernel_counted(reset=True))
        self._whole = True
        yield self._stack_counts(counted, stack)

    def _add_counts(self, counted: dict, samples) -> None:
        """(sample, count) pairs added to `counted` by (probe, tid, resolver key)."""
        key = self.resolver.key
        for s, n in samples:
            k = (s.probe, s.tid, key(s))
            counted[k] = counted.get(k, 0) + n

    def _stack_counts(self, counted: dict, stack_of) -> list:
        comm, ns_id = self.tracker.comm, self.tracker.ns_id
        if self.weight is not None:         # as the kernel's signed 64-bit sums
            counted = {k: as_s64(n) for k, n in counted.items()}
        per_thread = self.opts.per_thread
        return [StackCount(comm(rkey[0], tid), rkey[0], stack_of(rkey), n,
                           self.labels[probe], tid if per_thread else 0,
                           ns_id(rkey[0]), ns_id(tid) if per_thread else 0)
                for (probe, tid, rkey), n in counted.items()]

    def _counted_samples(self):
        """(sample, count): each sample of the stream once (as the capture
        settles it), then what the kernel counted."""
        capture = self.capture
        weighed = self.weight is not None
        for piece in self.pieces():
            for s in piece.samples:
                yield capture.settle(s, self._unwound_now), weight_of(s) if weighed else 1
        counted = self._kernel_counted()
        self._whole = True
        yield from counted

    def _kernel_counted(self, reset: bool = False) -> list:
        """(sample, count) the kernel counted (so far: `reset` zeroes it),
        of the run's processes; [] where the kernel counts nothing."""
        capture = self.capture
        if not capture.counts_in_kernel:
            return []
        exclude, keep, comm = self._excluded_pids(), self.keep, self.tracker.comm
        counted = [(s, n) for s, n in capture.counted(reset)
                   if s.pid not in exclude and (keep is None or keep(s, comm(s.pid, s.tid)))]
        if self.recorder is not None:
            self.recorder.add_counted(counted)
        return counted

    def _unwound_now(self, s: RawSample) -> tuple:
        """(UnwoundSample, kernel frames, whether its addresses key it
        alone: nothing noted and its process's mappings unchanged since)."""
        pid, generation, (addrs, notes), kernel = self.resolver.key(s)
        keyable = not notes and generation == self.tracker.generations.get(pid, 0)
        return unwound_sample(s, addrs, notes), kernel, keyable

    def run_through(self) -> None:
        """Run to the end naming nothing: what `ustack record` does (the
        Recorder saves the stream as it passes)."""
        for _counted in self._counted_samples():
            pass


def weight_of(sample: RawSample) -> int:
    """The value a weighted run sums for an event: its one fetch-arg (0
    where the record could not hold it)."""
    args = sample.args
    value = args[0][2] if args else None
    return value if isinstance(value, int) else 0


class _Replay(Session):
    """Session.replay: open() reads a recording's header, not the kernel."""

    def __init__(self, path: str, opts: Options, objects, keep=None):
        super().__init__(opts)
        self.tracker.live = False       # recorded pids are not this host's processes
        self.python_code.live = False
        from .recording.reader import RecordedCapture
        self._recording = RecordedCapture(path, objects)
        self.keep = keep or None

    def open(self) -> None:
        capture = self._recording
        capture.python_code = self.python_code      # the recorded code objects' names
        capture.open()
        self.capture = capture
        self.labels = list(capture.labels)
        self.plan = policy.Plan("recording", capture.modes)
        self.target = process.recording(capture.path)
