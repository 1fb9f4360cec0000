"""The tracefs backend (`--backend tracefs`): the ftrace and uprobe_events recipes done right,
for hosts where perf events and BPF are unavailable or not allowed.

Events go into a private ftrace instance (kernel/ftrace_instance.py) with
its own pid filter (set_event_pid + the event-fork option: new threads and
children join) and read as binary ring-buffer pages from every CPU's
trace_pipe_raw. Stacks:
- syscalls and tracepoints: the instance's `userstacktrace` option, a
  frame-pointer walk of at most 8 frames (FTRACE_STACK_ENTRIES), written as
  a separate user_stack record right after the event on the same CPU;
- uprobes: fetch-args copy %ip, %sp, %bp and up to 3,048 bytes of stack
  words (--stack-size, at most what the kernel's 3 KiB cap on a probe's
  fields leaves) into the event itself, which
  the DWARF unwinder takes like a perf REGS_USER/STACK_USER sample (deeper
  than 8 frames, no frame pointers needed). With --unwind fp, uprobes use
  userstacktrace too.

The capture offers PerfCapture's interface (its records are decoded by
kernel/ftrace_records.py), so the session drives either backend unchanged."""
from __future__ import annotations

import os
import time

from ..defaults import DEFAULT_BUFFER_PAGES   # pages per CPU, as for perf
from ..kernel import procfs
from ..kernel.ftrace_instance import PROCESSES_SUFFIX, FtraceInstance
from ..kernel.ftrace_ring import page_time
from ..kernel.ftrace_records import (CPU_PREFIX, EVERYTHING, PROCESSES_CPU, EventLayout,
                                     TracefsRecords, horizon_chunk)
from ..kernel.perf_event import cpus_online
from ..kernel import tracefs
from ..kernel.tracefs import tracepoint_id
from ..kernel.leftovers import remove_stale_tracing
from ..kernel.uprobe_events import UprobeEvents
from ..model import Losses, MmapEvent, TracepointProbe, UprobeProbe, UstackError
from ..probes.fetchargs import RESERVED_PREFIX
from ..probes.resolve import is_glob
from ..target.process import command_executable
from ..target.traced_command import TracedCommand
from .perf import define_uprobe, tracepoint_fields
from .tracefs_maps import ProcessWatch
from .contract import Capture

STACK_ARRAY_WORDS = 64               # the kernel's MAX_ARRAY_LEN per fetch-arg
# The fixed fields of a probe event's record may total at most 3072 bytes
# (MAX_PROBE_EVENT_SIZE): %ip, %sp, %bp, the user's fetch-args (8 bytes
# each at most) and, in what is left, stack words: arrays of 64, a last
# shorter one
MAX_PROBE_EVENT_SIZE = 3072
MAX_STACK_BYTES = MAX_PROBE_EVENT_SIZE - 3 * 8
LIMIT = "the kernel's per-event limit for a tracefs uprobe"
# what a stack cut at that limit advises, as raising --stack-size cannot help
CUT_AT_LIMIT = f"that is {LIMIT}: --backend perf or bpf copy deeper stacks"
PAGES_PER_READ = 256                 # per CPU per drain pass
PROCESSES_PAGES = 64                 # per CPU, of the processes' instance (forks, execs)


class TracefsCapture(Capture):
    """The capture contract on a private ftrace instance."""

    def __init__(self, probes: list, target, buffer_pages=None,
                 modes: tuple = (), stack_size: int = MAX_STACK_BYTES):
        self.probes = probes
        self.target = target
        self.buffer_pages = buffer_pages or DEFAULT_BUFFER_PAGES
        self.modes = tuple(modes) or ("fp",) * len(probes)
        self.stack_size = stack_size
        self.instance = FtraceInstance()
        # the processes' fork and exec records, in an instance of their own
        # (kernel/ftrace_instance.py): a full buffer's losses there are
        # records, said apart from the events' (None: not followed)
        self.processes = None
        self.uprobes = UprobeEvents()
        self.layouts: dict = {}
        self._enable: list = []           # (group, name) to switch on
        self._records = TracefsRecords(self.layouts)
        self.decode = self._records.read  # see TracefsRecords.read
        self._page = 4096
        self._final = self._end_sent = False
        self._monotonic = False           # the instance stamps with CLOCK_MONOTONIC
        self._holding = False             # the last pass read records: see read_chunks
        self.stack_bytes = 0              # per DWARF uprobe event (for the header)
        self.cut_advice = None            # set when the kernel's limit cut the copy
        self._records_lost = 0            # fork/exec records the processes' buffer lost

    @property
    def unwind_note(self) -> str:
        notes = []
        if self.stack_bytes:
            limit = f" ({LIMIT})" if self.cut_advice else ""
            notes.append(f"uprobes: DWARF on {self.stack_bytes} stack bytes per event{limit}")
        if "fp" in self.modes:
            notes.append(f"ftrace userstacktrace: frame pointers, at most "
                         f"{self._records.stack_entries} frames")
        return "; ".join(notes)

    @property
    def reach_note(self) -> str:
        """What a user must know: set_event_pid filters what is recorded,
        but a uprobe is armed (and slows) every process mapping its file."""
        files = list(dict.fromkeys(p.path for p in self.probes
                                   if isinstance(p, UprobeProbe)))
        if not files:
            return ""
        named = ", ".join(files[:2]) + (f" and {len(files) - 2} more files"
                                        if len(files) > 2 else "")
        return f"its uprobes fire in every process that maps {named}"

    def losses(self) -> Losses:
        return Losses(lost=self._records.lost, records_lost=self._records_lost)

    # -- setting up ------------------------------------------------------------
    def _uprobe(self, index: int, probe: UprobeProbe) -> None:
        dwarf = self.modes[index] == "dwarf"
        own = []
        if dwarf:
            room = MAX_STACK_BYTES - 8 * len(probe.fetch_args)
            words = max(1, min(self.stack_size, room) // 8)
            if self.stack_size > room:
                self.cut_advice = CUT_AT_LIMIT
            # the header says the smallest copy of the run's probes
            self.stack_bytes = min(self.stack_bytes or words * 8, words * 8)
            own = [f"{RESERVED_PREFIX}ip=%ip", f"{RESERVED_PREFIX}sp=%sp",
                   f"{RESERVED_PREFIX}bp=%bp"]
            own += [f"{RESERVED_PREFIX}s{i}=+{start * 8}(%sp)"
                    f":x64[{min(STACK_ARRAY_WORDS, words - start)}]"
                    for i, start in enumerate(range(0, words, STACK_ARRAY_WORDS))]
        elif probe.return_address_slot is not None:
            own = [f"{RESERVED_PREFIX}return_address=+{8 * probe.return_address_slot}(%sp):x64"]
        event, ident, fields, args = define_uprobe(self.uprobes, probe, tuple(own))
        layout = EventLayout(index)
        layout.args = args
        if dwarf:
            layout.ip = fields[f"{RESERVED_PREFIX}ip"].offset
            layout.sp = fields[f"{RESERVED_PREFIX}sp"].offset
            layout.bp = fields[f"{RESERVED_PREFIX}bp"].offset
            layout.stack = fields[f"{RESERVED_PREFIX}s0"].offset
            layout.stack_len = words * 8
        elif own:
            layout.return_address = fields[f"{RESERVED_PREFIX}return_address"].offset
        layout.keep = bool(own or probe.fetch_args)
        self.layouts[ident] = layout
        self._enable.append(tuple(event.split("/")))

    def _tracepoint(self, index: int, probe: TracepointProbe) -> None:
        layout = EventLayout(index)
        layout.args = tracepoint_fields(probe)
        layout.keep = layout.args is not None
        self.layouts[tracepoint_id(probe.group, probe.name)] = layout
        self._enable.append((probe.group, probe.name))

    def _follow_processes(self) -> None:
        """ftrace has no mmap records: forks and execs come from the
        scheduler's events in the instance, maps from /proc (see
        tracefs_maps.py)."""
        events = [("sched", "sched_process_fork"), ("sched", "sched_process_exec")]
        try:
            formats = [tracefs.event_format(*e) for e in events]
        except UstackError:      # a kernel without them: maps still come from /proc
            self._records.follow_processes(ProcessWatch())
            return
        self._records.follow_processes(ProcessWatch(), *formats)
        self.processes = FtraceInstance(PROCESSES_SUFFIX)
        self.processes.create()
        self.processes.write("tracing_on", "0")
        self.processes.write("buffer_size_kb", str(PROCESSES_PAGES * 4))
        if self._monotonic:
            self.processes.write("trace_clock", "mono")
        self._processes_events = events

    def _stamp_monotonic(self) -> None:
        """Records stamped with CLOCK_MONOTONIC (ftrace's "mono" clock), as
        perf's are: a pass over the buffers can then say, by the time it
        began, which records are all in (see read_chunks), and samples fall
        into the intervals of time.monotonic(). A kernel without it keeps
        its local clock, and a batch's records are ordered among themselves."""
        self._records.ordered = True      # nothing goes out before a horizon
        try:
            self.instance.write("trace_clock", "mono")
        except UstackError:
            return
        self._monotonic = True

    def _filter_pids(self) -> None:
        """set_event_pid: the target's threads (-p) or the command (-c);
        event-fork adds every thread and child they create from now on."""
        scope = self.target.scope
        if scope == "system":
            return
        for instance in self._instances():
            self._filter_pids_of(instance)

    def _filter_pids_of(self, instance: FtraceInstance) -> None:
        instance.option("event-fork", True)
        if self.target.scope == "command":
            instance.write("set_event_pid", str(self.target.pid))
            return
        done = 0
        for tids in procfs.thread_batches(self.target.pid):
            path = os.path.join(instance.path, "set_event_pid")
            fd = os.open(path, os.O_WRONLY | (os.O_APPEND if done else os.O_TRUNC))
            try:
                os.write(fd, " ".join(map(str, sorted(tids))).encode())
            except OSError:
                pass                      # a thread exited meanwhile
            finally:
                os.close(fd)
            done += len(tids)
        if not done:
            raise UstackError(f"no such process: {self.target.pid}")

    def _instances(self) -> list:
        """The run's instances: its events', and its processes' if followed."""
        return [self.instance] + ([self.processes] if self.processes is not None else [])

    def open(self) -> None:
        remove_stale_tracing()            # what a killed run left behind
        self._records.set_user_stack(tracefs.event_format("ftrace", "user_stack"))
        try:
            self.instance.create()
            self.instance.write("tracing_on", "0")
            self.instance.write("buffer_size_kb", str(self.buffer_pages * 4),
                                "buffer size (--buffer-pages)")
            try:
                with open(os.path.join(self.instance.path, "buffer_subbuf_size_kb")) as f:
                    self._page = int(f.read()) * 1024
            except (OSError, ValueError):
                pass
            self.instance.option("userstacktrace", True)
            self._stamp_monotonic()
            self._follow_processes()
            for index, probe in enumerate(self.probes):
                self.interrupt.check()
                if isinstance(probe, UprobeProbe):
                    self._uprobe(index, probe)
                else:
                    self._tracepoint(index, probe)
            self._filter_pids()
            for instance in self._instances():
                instance.open_pipes(cpus_online())
            if isinstance(self.target, TracedCommand):
                self.target.on_exit = self._snapshot_maps
            else:
                self._switch_on()
        except BaseException:
            self.close()
            raise

    def _switch_on(self) -> None:
        if self.processes is not None:      # first: no event comes before its fork
            for group, name in self._processes_events:
                self.processes.enable(group, name)
            self.processes.write("tracing_on", "1")
        for group, name in self._enable:
            self.instance.enable(group, name)
        self.instance.write("tracing_on", "1")

    def _snapshot_maps(self, pid: int, execs: int) -> None:
        """At the command's exit stop: its mappings, for stacks still
        queued; they are the program's after its last exec, and go out
        after that exec's record."""
        self._records.after_execs(pid, execs, [MmapEvent(pid, pid, m)
                                               for m in procfs.executable_mappings(pid)])

    def start(self) -> None:
        if self.target.scope != "command":
            return
        self.target.release()             # now at its first instruction
        if isinstance(self.target, TracedCommand):
            self._switch_on()
            self.target.resume()

    # -- reading -----------------------------------------------------------------
    def read_chunks(self, timeout_ms: int) -> list:
        """A pass over every CPU's buffer, then a horizon: the time the pass
        began, before which every record has been read, whichever CPU
        wrote it (a buffer left unread past PAGES_PER_READ: the time its last
        page read begins). The pass after one that read records sends its
        horizon even when it reads nothing, so that those records go out."""
        chunks = []
        page = self._page
        horizon = time.monotonic_ns() if self._monotonic else EVERYTHING
        for cpu, fd in self._pipes():
            head = CPU_PREFIX.pack(cpu)
            data = b""
            for _ in range(PAGES_PER_READ):
                try:
                    data = os.read(fd, page)
                except BlockingIOError:
                    break
                except OSError:
                    break
                if not data:
                    break
                chunks.append(head + data)
            else:
                if data:
                    horizon = min(horizon, page_time(data))
        if chunks or self._holding:
            self._holding = bool(chunks)
            chunks.append(horizon_chunk(horizon))
            return chunks
        if self._final:
            if not self._end_sent:        # tell the reader the run is over
                self._end_sent = True
                return [b""]
            return []
        if timeout_ms:
            time.sleep(timeout_ms / 1000)
        return chunks

    def _pipes(self) -> list:
        """(chunk prefix's CPU, trace_pipe_raw fd) of every instance's CPUs."""
        pipes = list(self.instance.fds.items())
        if self.processes is not None:
            pipes += [(cpu | PROCESSES_CPU, fd) for cpu, fd in self.processes.fds.items()]
        return pipes

    def flush_lost(self) -> None:
        self._records.lost_entries = self.instance.lost()
        if self.processes is not None:
            self._records_lost = self.processes.lost()
        self._final = True

    def stop(self) -> None:
        for instance in self._instances():
            if instance.created:
                try:
                    instance.write("tracing_on", "0")
                except UstackError:
                    pass

    def close(self) -> None:
        if self.processes is not None:
            self.processes.close()
        self.instance.close()             # before the probes: it holds them
        self.uprobes.close()


def refuse_shared_globs(probes: list, pid: int | None, cmdline: str | None) -> None:
    """A glob over a file other than the -p/-c program's own puts a uprobe
    on each of its functions in every process that maps it (a library:
    the whole machine); refused unless the user accepts that (-a). Before
    the command starts; a run of every process asked for that."""
    if pid is not None:
        main_binary, who = f"/proc/{pid}/exe", f"PID {pid}"
    elif cmdline is not None:
        main_binary, who = command_executable(cmdline), "the -c command"
        if main_binary is None:
            return                          # launch() says why
    else:
        return
    for probe in probes:
        spec = probe.spec
        if (not isinstance(probe, UprobeProbe) or not is_glob(spec.function or "")
                or _same_file(probe.path, main_binary)):
            continue
        raise UstackError(
            f"{spec.text}: on the tracefs backend its uprobes fire in every process "
            f"that maps {probe.path}, not only in {who}; add -a to accept that, "
            f"or use --backend perf or bpf")


def _same_file(path: str, other: str | None) -> bool:
    try:
        return other is not None and os.path.samefile(path, other)
    except OSError:
        return False
