"""Wires the stages for one run: parse and resolve probes, set up the
target, capture, then unwind, symbolize and report. The only module that
imports every stage (it sits rightmost in DESIGN.md's flow)."""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, TextIO

from .capture.bpf import DEFAULT_STACK_STORAGE
from .capture.perf import (DEFAULT_BUFFER_PAGES, DEFAULT_STACK_SIZE,
                           DWARF_BUFFER_PAGES, PerfCapture)
from .model import (CommEvent, ProfileTarget, Sample, Stack, StackCount, UstackError)
from .probes.resolve import resolve_uprobes, tracepoint_targets
from .probes.spec import parse_event
from .report.counts import format_counts, format_folded
from .report.text import format_stack, format_time, header_parts
from .symbols.symbolizer import SymbolOptions, Symbolizer
from .target import process
from .target.traced_command import launch_traced
from .target.mappings import MappingTracker, PinnedView
from .unwind import policy
from .unwind.dwarf import DwarfUnwinder
from .unwind.fp import frame_pointer_stack

POLL_MS = 100
SLICE_S = 0.05                     # decoding time between two writes of output
DRAIN_POLL_MS = 5                  # how often the drain thread empties buffers
PIECE = 64 << 10                   # bytes of a chunk decoded in one step
BACKLOG_LIMIT = 256 << 20          # bytes of undecoded records held in memory


@dataclass
class Options:
    mode: str                              # trace | count | profile
    events: list = field(default_factory=list)
    pid: Optional[int] = None
    command: Optional[str] = None
    duration: Optional[float] = None
    output_format: str = "text"            # text | folded
    per_pid: bool = False
    offsets: bool = False                  # count: keep call sites apart
    buffer_pages: Optional[int] = None     # None: sized for the unwinder
    unwind: str = "auto"                   # auto | fp | dwarf
    stack_size: int = DEFAULT_STACK_SIZE
    symbols: SymbolOptions = SymbolOptions()
    # which kernel facility captures: auto | perf | bpf | tracefs
    backend: str = "auto"
    # in-kernel counting (bpf_session.py)
    kernel_stacks: bool = False            # --kernel (bpf only)
    stack_storage: int = DEFAULT_STACK_STORAGE   # --stack-storage-size
    interval: Optional[float] = None       # funccount -i


def resolve_probes(specs: list, pid: Optional[int]) -> list:
    probes = []
    for spec in specs:
        if spec.kind in ("uprobe", "uretprobe"):
            probes.extend(resolve_uprobes(spec, pid))
        elif spec.kind in ("syscall", "tracepoint"):
            probes.extend(tracepoint_targets(spec))
        elif spec.kind == "profile":
            probes.append(ProfileTarget(spec, spec.hz, f"profile:hz:{spec.hz}"))
        else:
            raise UstackError(f"unsupported event kind: {spec.kind}")
    return probes


class _Stop:
    """Ctrl-C and SIGTERM end the run cleanly: stop reading, report."""

    def __init__(self):
        self.requested = False
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Drainer(threading.Thread):
    """Empties the kernel ring buffers into a bounded in-memory backlog, on
    its own thread: decoding on the main thread (an ELF parsed on first
    use, a burst of new stacks) then cannot stall the draining long enough
    for the kernel buffers to overflow. poll() releases the GIL, and Python
    hands the GIL over every few ms, so this thread keeps up."""

    def __init__(self, capture: PerfCapture):
        super().__init__(name="ustack-drain", daemon=True)
        self.capture = capture
        self.queue: deque = deque()        # [batch, offsets]
        self.bytes = 0
        self.ready = threading.Event()
        self._stop_flag = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._stop_flag.is_set():
            if self.bytes >= BACKLOG_LIMIT:
                time.sleep(0.005)          # let the kernel count what is lost
                continue
            batch = self.capture.read_chunks(DRAIN_POLL_MS)
            if batch:
                with self._lock:
                    self.bytes += sum(map(len, batch))
                self.queue.append([batch, [0] * len(batch)])
                self.ready.set()

    def next_batch(self, timeout: float):
        """The oldest batch (possibly partly decoded), or None after timeout."""
        if not self.queue:
            self.ready.clear()
            if not self.queue:
                self.ready.wait(timeout)
        return self.queue[0] if self.queue else None

    def done(self, entry) -> None:
        self.queue.popleft()
        with self._lock:
            self.bytes -= sum(map(len, entry[0]))

    def finish(self) -> None:
        self._stop_flag.set()
        if self.is_alive():
            self.join()

    def rest(self):
        """After finish(): the queued batches, then whatever the buffers
        hold, then the losses the kernel was still holding back."""
        while self.queue:
            batch, offsets = self.queue.popleft()
            yield [c[o:] for c, o in zip(batch, offsets)]
        for flushed in (False, True):
            if flushed:
                self.capture.flush_lost()
            while True:
                batch = self.capture.read_chunks(0)
                if not batch:
                    break
                yield batch


class Run:
    backend = "perf"                   # printed in the header line

    def __init__(self, opts: Options, out: TextIO, err: TextIO):
        self.opts, self.out, self.err = opts, out, err
        self.tracker = MappingTracker()
        self.counts: dict = {}
        self.dwarf = DwarfUnwinder(debug_dirs=opts.symbols.debug_dirs)
        self.pending: list = []            # text waiting to be written
        self.headers: dict = {}            # (tid, cpu, event id) -> header parts

    # -- helpers ------------------------------------------------------------
    def _addresses(self, sample: Sample, find=None) -> tuple:
        """(return addresses innermost first, notes) for one sample."""
        pid = sample.pid
        if find is None:
            find = self.tracker.find
        if sample.regs is not None:
            return self.dwarf.unwind(sample.regs, sample.stack or b"",
                                     lambda addr: find(pid, addr))
        addrs = frame_pointer_stack(sample,
                                    lambda addr: find(pid, addr) is not None)
        return addrs, ()

    def _stack_key(self, reader, ident, pid, tid, chain, extra) -> tuple:
        """What tells raw stacks apart before symbolization, as a pair: the
        callchain bytes and entry word of a frame-pointer sample (not its
        fetch-arg values), decoded later, once per distinct stack; or the
        (addresses, notes) of a DWARF sample, unwound now, since its stack
        copy is nearly always unique."""
        if reader.is_dwarf(ident):
            return self._addresses(reader.decode(ident, pid, tid, chain, extra))
        return chain, reader.entry_word(ident, extra) if extra else b""

    def _unwound(self, reader, ident, pid, tid, key, find=None) -> tuple:
        """(addresses, notes) of a _stack_key."""
        first, second = key
        if isinstance(first, tuple):
            return first, second
        return self._addresses(reader.fp_sample(ident, pid, tid, first, second), find)

    # -- the run --------------------------------------------------------------
    def execute(self) -> int:
        opts = self.opts
        specs = [parse_event(e) for e in opts.events]
        if opts.pid is not None and opts.command:
            raise UstackError("use either -p PID or -c CMD, not both")
        if os.geteuid() != 0:
            raise UstackError("ustack needs root to open perf events and uprobes "
                              "(run it with sudo)")
        # Ctrl-C or SIGTERM from here on ends the run cleanly (report, remove
        # probes), even when it arrives while the probes are being set up
        with _Stop() as stop:
            return self._setup_and_loop(specs, stop)

    def _setup_and_loop(self, specs: list, stop) -> int:
        opts = self.opts
        if opts.pid is not None:
            target = process.attach(opts.pid)
        probes = resolve_probes(specs, opts.pid)
        tracefs = opts.backend == "tracefs"
        if tracefs:
            from .capture.tracefs import unwind_modes
            self.backend = "tracefs"
            modes = unwind_modes(probes, opts.unwind)
        if opts.pid is None:
            launch = launch_traced if tracefs else process.launch
            target = launch(opts.command) if opts.command else process.everything()
        main_binary = (f"/proc/{target.pid}/exe" if target.mode == "pid" else
                       process.executable(target.argv) if target.mode == "command"
                       else None)
        if not tracefs:
            modes = {p.label: policy.choose(p, opts.unwind, main_binary) for p in probes}
        return self._capture_and_loop(probes, target, modes, stop)

    def _open_capture(self, probes, target, modes: dict):
        """Open the events (a held -c command is told to exit on failure)."""
        opts = self.opts
        dwarf_labels = frozenset(l for l, m in modes.items() if m == "dwarf")
        pages = opts.buffer_pages or (DWARF_BUFFER_PAGES if dwarf_labels
                                      else DEFAULT_BUFFER_PAGES)
        if self.backend == "tracefs":
            from .capture.tracefs import TracefsCapture
            capture = TracefsCapture(probes, target, opts.buffer_pages, dwarf_labels,
                                     opts.stack_size)
        else:
            capture = PerfCapture(probes, target, pages, dwarf_labels, opts.stack_size)
        try:
            capture.open()
        except BaseException:
            target.abort()
            raise
        return capture

    def _capture_and_loop(self, probes, target, modes: dict, stop) -> int:
        self.unwind_summary = "/".join(sorted(set(modes.values())))
        capture = self._open_capture(probes, target, modes)
        try:
            return self._loop(capture, target, probes, stop)
        finally:
            capture.close()
            if target.mode == "command" and target.exit_status is None:
                target.interrupt()
                target.wait(block=True)

    def _loop(self, capture: PerfCapture, target, probes, stop) -> int:
        opts = self.opts
        if target.mode == "pid":
            self.tracker.seed_from_proc(target.pid)
        labels = ", ".join(p.label for p in probes[:3])
        if len(probes) > 3:
            labels += f", … ({len(probes)} events)"
        print(f"Tracing {labels} in {target.description} "
              f"[backend {self.backend}, unwind "
              f"{self.unwind_summary}{_note(capture.unwind_note)}]"
              + ("" if opts.duration else "... Hit Ctrl-C to end."),
              file=self.err, flush=True)
        # one symbolizer (one cache) for the run; counted stacks pin the view
        # to the exec generation they were seen in
        view = PinnedView(self.tracker)
        symbolizer = Symbolizer(view, opts.symbols)
        reader = capture.reader
        on_raw = (self._tracer(reader, symbolizer) if opts.mode == "trace"
                  else self._counter(reader))

        def process(batch: list, offsets: list) -> bool:
            """Decode up to PIECE bytes of each chunk of a batch; True when
            the batch is done. Every chunk's metadata comes before any sample
            of the piece: a sample may sit in another CPU's buffer ahead of
            the MMAP2 record that explains it."""
            raws: list = []
            metas: list = []
            done = True
            for i, chunk in enumerate(batch):
                offsets[i] = reader.raw_samples(
                    chunk, lambda t, e: metas.append((t, len(metas), e)), raws,
                    offsets[i], PIECE)
                done = done and offsets[i] >= len(chunk)
            # in time order across CPUs: an exec's COMM on one CPU must come
            # before the MMAP2s it caused on another
            for _t, _seq, event in sorted(metas, key=lambda m: m[:2]):
                self._on_meta(event)
            for r in raws:
                on_raw(*r)
            return done

        deadline = time.monotonic() + opts.duration if opts.duration else None
        drainer = _Drainer(capture)
        capture.start()
        drainer.start()
        try:
            self._follow(drainer, process, target, stop, deadline)
        finally:
            drainer.finish()            # before the buffers are unmapped
        capture.stop()
        for batch in drainer.rest():   # all that is still queued or in the buffers
            offsets = [0] * len(batch)
            while not process(batch, offsets):
                pass
        self.out.write("".join(self.pending))
        self.pending.clear()
        if opts.mode != "trace":
            self._report_counts(reader, symbolizer, view)
        self.out.flush()
        # debug files refused by the symbolizer or the unwinder, once each
        for warning in dict.fromkeys(symbolizer.warnings + self.dwarf.warnings):
            print(f"ustack: {warning}", file=self.err)
        if reader.lost:
            print(f"Lost {reader.lost} events: the {self.backend} "
                  "buffer was full "
                  f"(try --buffer-pages {capture.buffer_pages * 4})",
                  file=self.err)
        if reader.throttled:
            print(f"The kernel throttled sampling {reader.throttled} times: samples "
                  "were dropped uncounted (see kernel.perf_event_max_sample_rate; "
                  "lower -F)", file=self.err)
        if target.mode == "command" and target.exit_status not in (None, 0):
            print(f"{target.argv[0]} exited with status {target.exit_status}",
                  file=self.err)
        return 0

    def _follow(self, drainer, process, target, stop, deadline) -> None:
        """Decode batches as the drain thread queues them, writing output
        every SLICE_S, until Ctrl-C, the deadline or the target's exit."""
        while True:
            entry = drainer.next_batch(POLL_MS / 1000)
            if entry is not None:
                slice_end = time.monotonic() + SLICE_S
                while not process(entry[0], entry[1]):
                    if time.monotonic() > slice_end:
                        break
                else:
                    drainer.done(entry)
                self.out.write("".join(self.pending))
                self.pending.clear()
            self._on_tick()
            if (stop.requested or target.wait() or
                    (deadline is not None and time.monotonic() >= deadline)):
                return

    def _on_tick(self) -> None:
        """Called about every POLL_MS while the run follows the target."""

    def _on_meta(self, event) -> None:
        self.tracker.apply(event)
        if isinstance(event, CommEvent):
            self.headers.clear()            # a thread was renamed (or exec'd)

    def _tracer(self, reader, symbolizer: Symbolizer):
        """on_raw for `trace`: one text record per event. The frame lines of
        each distinct raw stack are symbolized and formatted once, and so is
        the header's text around the timestamp for each thread, CPU and event."""
        blocks: dict = {}
        heads = self.headers
        generations = self.tracker.generations
        pending = self.pending
        stack_key = self._stack_key

        def on_raw(ident, pid, tid, t, cpu, chain, extra):
            skey = stack_key(reader, ident, pid, tid, chain, extra)
            key = (pid, generations.get(pid, 0)) + skey
            block = blocks.get(key)
            if block is None:
                addrs, notes = self._unwound(reader, ident, pid, tid, skey)
                if len(blocks) > 100_000:
                    blocks.clear()
                block = blocks[key] = format_stack(
                    Stack(symbolizer.frames(pid, addrs), notes))
            hkey = (tid, cpu, ident)
            head = heads.get(hkey)
            if head is None:
                comm = self.tracker.comm(pid, tid)
                head = heads[hkey] = header_parts(comm, pid, tid, cpu,
                                                  reader.label(ident))
            args = reader.args_text(ident, extra)      # fetch-args, ' a=1 …'
            pending.append(f"{head[0]}{format_time(t)}{head[1]}{block}" if not args
                           else f"{head[0]}{format_time(t)}{head[1][:-1]}{args}\n{block}")
        return on_raw

    def _counter(self, reader):
        """on_raw for `count`/`profile`: count raw frame-pointer stacks and
        decode them at the end; DWARF samples (a stack copy each) are
        unwound at once and counted by their addresses."""
        counts = self.counts
        generations = self.tracker.generations
        stack_key = self._stack_key

        def on_raw(ident, pid, tid, t, cpu, chain, extra):
            key = (ident, pid, tid, generations.get(pid, 0)) + stack_key(
                reader, ident, pid, tid, chain, extra)
            counts[key] = counts.get(key, 0) + 1
        return on_raw

    def _report_counts(self, reader, symbolizer: Symbolizer, view: PinnedView) -> None:
        counted = []
        for key, n in self.counts.items():
            ident, pid, tid, generation = key[:4]
            view.generation = generation
            addrs, notes = self._unwound(reader, ident, pid, tid, key[4:], view.find)
            stack = Stack(symbolizer.frames(pid, addrs), notes)
            comm = self.tracker.comm(pid, tid)
            counted.append(StackCount(comm, pid, stack, n, reader.label(ident)))
        self._write_counts(counted)

    def _write_counts(self, counted: list) -> None:
        opts = self.opts
        if opts.output_format == "folded":
            self.out.write(format_folded(counted, opts.per_pid))
        else:
            self.out.write(format_counts(counted, opts.per_pid, opts.offsets))


def _note(text: str) -> str:
    return f"; {text}" if text else ""


def run(opts: Options, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    if opts.mode == "funccount" or (opts.mode in ("count", "profile")
                                    and opts.backend in ("auto", "bpf")):
        from .bpf_session import BpfRun
        return BpfRun(opts, out, err).execute()
    return Run(opts, out, err).execute()
