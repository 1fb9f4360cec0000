"""The tracefs backend (`--backend tracefs`): seeds 000 and 001 done right,
for hosts where perf events and BPF are unavailable or not allowed.

Events go into a private ftrace instance (kernel/ftrace_instance.py) with
its own pid filter (set_event_pid + the event-fork option: new threads and
children join) and read as binary ring-buffer pages from every CPU's
trace_pipe_raw. Stacks:
- syscalls and tracepoints: the instance's `userstacktrace` option, a
  frame-pointer walk of at most 8 frames (FTRACE_STACK_ENTRIES), written as
  a separate user_stack record right after the event on the same CPU;
- uprobes: fetch-args copy %ip, %sp, %bp and up to 3.5 KiB of stack words
  into the event itself, which the DWARF unwinder takes like a perf
  REGS_USER/STACK_USER sample (deeper than 8 frames, no frame pointers
  needed). With --unwind fp, uprobes use userstacktrace too.

The capture and its reader offer the interface of PerfCapture and
RecordReader, so session.Run drives either backend unchanged."""
from __future__ import annotations

import os
import struct
import time
from collections import deque

from ..kernel import procfs
from ..kernel import trace_format as tf
from ..kernel.ftrace_instance import FtraceInstance, remove_stale_instances
from ..kernel.ftrace_ring import records
from ..kernel.perf_event import cpus_online
from ..kernel.tracefs import tracefs_root, tracepoint_id
from ..kernel.uprobe_events import UprobeEvents, remove_stale
from ..model import (MmapEvent, ProfileTarget, Sample, TracepointTarget,
                     UprobeTarget, UstackError)
from ..probes.fetchargs import RESERVED_PREFIX
from ..target.traced_command import TracedCommand
from .perf import DEFAULT_BUFFER_PAGES, define_uprobe   # pages per CPU, as for perf

FTRACE_STACK_ENTRIES = 8
STACK_ARRAY_WORDS = 64               # the kernel's MAX_ARRAY_LEN per fetch-arg
# The fixed part of a probe event's record may be at most 3072 bytes
# (MAX_PROBE_EVENT_SIZE): 5 arrays of stack words, regs and the user's args
MAX_EVENT_FIELDS_BYTES = 3072
MAX_STACK_BYTES = 5 * STACK_ARRAY_WORDS * 8
PAGES_PER_READ = 256                 # per CPU per drain pass
TGID_CACHE = 65536                   # threads whose tgid the reader remembers
_CPU = struct.Struct("<I4x")         # chunk prefix: which CPU the page is from
_Q = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_COMMON = struct.Struct("<HBBi")     # common_type, flags, preempt_count, pid


def unwind_modes(probes: list, requested: str) -> dict:
    """label -> 'fp' | 'dwarf' as this backend can do them."""
    modes = {}
    for p in probes:
        if isinstance(p, ProfileTarget):
            raise UstackError("profile events need perf events; the tracefs "
                              "backend has no timed samples")
        if isinstance(p, UprobeTarget):
            modes[p.label] = "fp" if requested == "fp" else "dwarf"
        elif requested == "dwarf":
            raise UstackError(
                f"--backend tracefs cannot copy the stack at {p.label} (only "
                "uprobes can, through fetch-args); use --unwind fp or auto")
        else:
            modes[p.label] = "fp"
    return modes


class _Layout:
    """What the reader needs about one event id."""
    __slots__ = ("label", "dwarf", "args", "keep", "ip", "sp", "bp",
                 "stack", "stack_len", "ra")

    def __init__(self, label: str):
        self.label = label
        self.dwarf = False
        self.args = None                 # ArgsDecoder of the user's fetch-args
        self.keep = False                # the record is needed after parsing
        self.ip = self.sp = self.bp = self.stack = self.ra = None
        self.stack_len = 0


class TracefsReader:
    """RecordReader's interface over trace_pipe_raw pages."""

    def __init__(self, layouts: dict, user_stack_id: int):
        self.layouts = layouts
        self.user_stack_id = user_stack_id
        # where a user_stack record keeps the tgid and its return addresses
        # (set_user_stack reads them from the event's format)
        self.tgid_at, self.callers_at = 8, 16
        self.stack_entries = FTRACE_STACK_ENTRIES
        self.lost_entries = 0            # ring-buffer entries the kernel lost
        self.throttled = 0
        self.metas: deque = deque()      # MmapEvents read from /proc for us
        self._pending: dict = {}         # cpu -> event waiting for its user stack
        # entries whose partner the ring buffer overwrote, for exact losses
        self.orphan_stacks = 0           # user stacks whose event is gone
        self.stackless = 0               # events whose user stack is gone
        self._tgids: dict = {}

    def set_user_stack(self, fmt: str) -> None:
        """The ftrace/user_stack event's id and layout, from its format
        (an ftrace-internal event: it has a format file but no id file)."""
        fields = tf.parse_format(fmt)
        try:
            tgid, callers = fields["tgid"], fields["caller"]
        except KeyError as e:
            raise UstackError(f"this kernel's ftrace/user_stack has no {e} field")
        self.user_stack_id = tf.event_id(fmt)
        self.tgid_at, self.callers_at = tgid.offset, callers.offset
        self.stack_entries = callers.count

    def _tgid(self, tid: int) -> int:
        """For an event without its user stack record (which says the tgid)."""
        pid = self._tgids.get(tid)
        if pid is None:
            if len(self._tgids) >= TGID_CACHE:
                self._tgids.clear()
            pid = self._tgids[tid] = procfs.tgid(tid)
        return pid

    def _emit(self, out: list, ev: list, pid, chain: bytes) -> None:
        ident, tid, t, cpu, extra = ev
        out.append((ident, pid if pid is not None else self._tgid(tid), tid, t,
                    cpu, chain, extra))

    def raw_samples(self, chunk, on_meta, out: list, start: int = 0,
                    budget: int = 1 << 62) -> int:
        """Parse one chunk (a CPU's page) whole; an empty chunk means the
        end of the run: events still waiting for a user stack go out."""
        while self.metas:
            on_meta(0, self.metas.popleft())
        if not chunk:
            for cpu in sorted(self._pending):
                self.stackless += 1
                self._emit(out, self._pending.pop(cpu), None, b"")
            return 0
        cpu = _CPU.unpack_from(chunk, 0)[0]
        pending = self._pending
        layouts = self.layouts
        ustack_id = self.user_stack_id
        tgid_at, callers_at = self.tgid_at, self.callers_at
        entries = self.stack_entries
        common = _COMMON.unpack_from
        for t, off, length in records(chunk, _CPU.size):
            typ, _flags, _pc, tid = common(chunk, off)
            if typ == ustack_id:
                ev = pending.pop(cpu, None)
                if ev is not None:
                    tgid = _U32.unpack_from(chunk, off + tgid_at)[0]
                    callers = chunk[off + callers_at:off + callers_at + 8 * entries]
                    n = 0
                    while n < entries and _Q.unpack_from(callers, 8 * n)[0]:
                        n += 1
                    self._emit(out, ev, tgid, bytes(callers[:8 * n]))
                else:
                    self.orphan_stacks += 1
                continue
            layout = layouts.get(typ)
            if layout is None:
                continue
            ev = pending.pop(cpu, None)
            if ev is not None:               # it got no user stack (kernel task)
                self.stackless += 1
                self._emit(out, ev, None, b"")
            extra = bytes(chunk[off:off + length]) if layout.keep else b""
            pending[cpu] = [typ, tid, t, cpu, extra]
        return len(chunk)

    @property
    def lost(self) -> int:
        """Events lost. The stats count ring-buffer entries, and
        userstacktrace writes two per event (the event, then its user
        stack): lost entries = 2 per event lost whole + 1 per event whose
        entry alone was lost (its stack was read as an orphan) + 1 per event
        read without its stack. Kernel threads (system-wide) write no stack
        entry: there this undercounts."""
        entries = self.lost_entries + self.orphan_stacks - self.stackless
        return max(0, entries) // 2

    def label(self, ident: int) -> str:
        layout = self.layouts.get(ident)
        return layout.label if layout else "?"

    def is_dwarf(self, ident: int) -> bool:
        layout = self.layouts.get(ident)
        return layout is not None and layout.dwarf

    def args_text(self, ident: int, extra) -> str:
        layout = self.layouts.get(ident)
        if layout is None or layout.args is None or not extra:
            return ""
        return layout.args.text(extra)

    def entry_word(self, ident: int, extra) -> bytes:
        """RecordReader.entry_word: the `ra` fetch-arg of an entry uprobe."""
        layout = self.layouts.get(ident)
        if layout is None or layout.ra is None or not extra:
            return b""
        return bytes(extra[layout.ra:layout.ra + 8])

    def fp_sample(self, ident: int, pid: int, tid: int, chain: bytes,
                  word: bytes) -> Sample:
        layout = self.layouts.get(ident) or _Layout("?")
        return Sample(layout.label, 0, pid, tid, -1,
                      struct.unpack(f"<{len(chain) // 8}Q", chain),
                      word or None, None, 0 if word else None)

    def decode(self, ident: int, pid: int, tid: int, chain: bytes, extra) -> Sample:
        layout = self.layouts.get(ident) or _Layout("?")
        ips = struct.unpack(f"<{len(chain) // 8}Q", chain)
        regs = stack = slot = None
        if layout.dwarf and extra:
            q = _Q.unpack_from
            regs = {"ip": q(extra, layout.ip)[0], "sp": q(extra, layout.sp)[0],
                    "bp": q(extra, layout.bp)[0]}
            stack = memoryview(extra)[layout.stack:layout.stack + layout.stack_len]
        elif layout.ra is not None and extra:
            stack, slot = extra[layout.ra:layout.ra + 8], 0
        return Sample(layout.label, 0, pid, tid, -1, ips, stack, regs, slot)


class TracefsCapture:
    """PerfCapture's interface on a private ftrace instance."""

    def __init__(self, probes: list, target, buffer_pages=None,
                 dwarf_labels: frozenset = frozenset(), stack_size: int = MAX_STACK_BYTES):
        self.probes = probes
        self.target = target
        self.buffer_pages = buffer_pages or DEFAULT_BUFFER_PAGES
        self.dwarf_labels = dwarf_labels
        self.stack_size = stack_size
        self.instance = FtraceInstance()
        self.uprobes = UprobeEvents()
        self.layouts: dict = {}
        self._enable: list = []           # (group, name) to switch on
        self.reader = TracefsReader(self.layouts, -1)
        self._page = 4096
        self._final = self._end_sent = False
        self.stack_bytes = 0              # per DWARF uprobe event (for the header)

    @property
    def unwind_note(self) -> str:
        notes = []
        if self.stack_bytes:
            notes.append(f"uprobes: DWARF on {self.stack_bytes} stack bytes per event")
        if any(p.label not in self.dwarf_labels for p in self.probes):
            notes.append(f"ftrace userstacktrace: frame pointers, at most "
                         f"{self.reader.stack_entries} frames")
        return "; ".join(notes)

    # -- setting up ------------------------------------------------------------
    def _uprobe(self, probe: UprobeTarget) -> None:
        dwarf = probe.label in self.dwarf_labels
        own = []
        if dwarf:
            room = MAX_EVENT_FIELDS_BYTES - 8 * (4 + len(probe.fetch_args))
            arrays = max(1, min(self.stack_size, MAX_STACK_BYTES, room)
                         // (STACK_ARRAY_WORDS * 8))
            self.stack_bytes = arrays * STACK_ARRAY_WORDS * 8
            own = [f"{RESERVED_PREFIX}ip=%ip", f"{RESERVED_PREFIX}sp=%sp",
                   f"{RESERVED_PREFIX}bp=%bp"]
            own += [f"{RESERVED_PREFIX}s{i}=+{i * STACK_ARRAY_WORDS * 8}(%sp)"
                    f":x64[{STACK_ARRAY_WORDS}]" for i in range(arrays)]
        elif probe.return_address_slot is not None:
            own = [f"{RESERVED_PREFIX}ra=+{8 * probe.return_address_slot}(%sp):x64"]
        event, ident, fields, args = define_uprobe(self.uprobes, probe, tuple(own))
        layout = _Layout(probe.label)
        layout.args = args
        if dwarf:
            layout.dwarf = True
            layout.ip = fields[f"{RESERVED_PREFIX}ip"].offset
            layout.sp = fields[f"{RESERVED_PREFIX}sp"].offset
            layout.bp = fields[f"{RESERVED_PREFIX}bp"].offset
            layout.stack = fields[f"{RESERVED_PREFIX}s0"].offset
            layout.stack_len = self.stack_bytes
        elif own:
            layout.ra = fields[f"{RESERVED_PREFIX}ra"].offset
        layout.keep = bool(own or probe.fetch_args)
        self.layouts[ident] = layout
        self._enable.append(tuple(event.split("/")))

    def _tracepoint(self, probe: TracepointTarget) -> None:
        self.layouts[tracepoint_id(probe.group, probe.name)] = _Layout(probe.label)
        self._enable.append((probe.group, probe.name))

    def _filter_pids(self) -> None:
        """set_event_pid: the target's threads (-p) or the command (-c);
        event-fork adds every thread and child they create from now on."""
        mode = self.target.mode
        if mode == "system":
            return
        self.instance.option("event-fork", True)
        if mode == "command":
            self.instance.write("set_event_pid", str(self.target.pid))
            return
        done: set = set()
        while True:                       # threads cloned meanwhile: rescan
            tids = set(procfs.threads(self.target.pid)) - done
            if not tids:
                break
            path = os.path.join(self.instance.path, "set_event_pid")
            fd = os.open(path, os.O_WRONLY | (os.O_APPEND if done else os.O_TRUNC))
            try:
                os.write(fd, " ".join(map(str, sorted(tids))).encode())
            except OSError:
                pass                      # a thread exited meanwhile
            finally:
                os.close(fd)
            done |= tids
        if not done:
            raise UstackError(f"no such process: {self.target.pid}")

    def open(self) -> None:
        remove_stale_instances()          # instances first: they hold the probes
        remove_stale()
        try:
            with open(os.path.join(tracefs_root(), "events", "ftrace",
                                   "user_stack", "format")) as f:
                self.reader.set_user_stack(f.read())
        except OSError:
            raise UstackError("this kernel's tracefs has no ftrace/user_stack event")
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
            for probe in self.probes:
                if isinstance(probe, UprobeTarget):
                    self._uprobe(probe)
                else:
                    self._tracepoint(probe)
            self._filter_pids()
            self.instance.open_pipes(cpus_online())
            if isinstance(self.target, TracedCommand):
                self.target.on_exit = self._snapshot_maps
            else:
                self._switch_on()
        except BaseException:
            self.close()
            raise

    def _switch_on(self) -> None:
        for group, name in self._enable:
            self.instance.enable(group, name)
        self.instance.write("tracing_on", "1")

    def _snapshot_maps(self, pid: int) -> None:
        """At the command's exit stop: its mappings, for stacks still queued."""
        for m in procfs.executable_mappings(pid):
            self.reader.metas.append(MmapEvent(pid, pid, m))

    def start(self) -> None:
        if self.target.mode != "command":
            return
        self.target.release()             # now at its first instruction
        if isinstance(self.target, TracedCommand):
            self._switch_on()
            self.target.resume()

    # -- reading -----------------------------------------------------------------
    def read_chunks(self, timeout_ms: int) -> list:
        chunks = []
        page = self._page
        for cpu, fd in self.instance.fds.items():
            head = _CPU.pack(cpu)
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
        if not chunks:
            if self._final:
                if not self._end_sent:    # tell the reader the run is over
                    self._end_sent = True
                    return [b""]
                return []
            if timeout_ms:
                time.sleep(timeout_ms / 1000)
        return chunks

    def flush_lost(self) -> None:
        self.reader.lost_entries = self.instance.lost()
        self._final = True

    def stop(self) -> None:
        if self.instance.created:
            try:
                self.instance.write("tracing_on", "0")
            except UstackError:
                pass

    def close(self) -> None:
        self.instance.close()             # before the probes: it holds them
        self.uprobes.close()

