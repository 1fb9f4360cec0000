"""`-f pprof`: a gzip-compressed profile.proto (`.pb.gz`, `.pprof`), what
`go tool pprof`, Pyroscope, Parca and Grafana read.

- Sample types: a `profile` run has `samples/count` and `cpu/nanoseconds`
  (count × 1e9/Hz; period_type cpu/nanoseconds, period 1e9/Hz); a `count`
  run has `<event>/count` for one event, else `events/count` with an
  `event` label on each sample.
- Labels: `pid` (a number), `comm`, and `note` when the unwinder left one.
- Functions: the shown name, the linkage (mangled) name as system_name
  when the object's symbol table has it, the source file with --lines.
- Locations: the runtime address, its mapping, and a Line per function
  at that address: the calls inlined there first (--inlines), the
  function they were inlined into last, each with its line (--lines). An
  unnamed frame is a Location without lines (pprof may name it from the
  object, which the mapping's build-id identifies).
- Mappings: per process and object, the executable segment's memory
  start, limit and file offset when a named frame told the object's load
  bias (pprof_objects.py), else zeros; the path as the process saw it;
  the GNU build-id in hex. Kernel frames (--kernel) belong to one
  `[kernel.kallsyms]` mapping spanning the kernel addresses seen.
  The first mapping is the traced program's (pprof calls it the main
  binary): the object named like the process."""
from __future__ import annotations

import gzip
import os
from typing import BinaryIO

from ..model import StackCount
from ..symbols.stacks import SEPARATOR
from .pprof_objects import ObjectFacts

KERNEL_MAPPING = "[kernel.kallsyms]"     # perf's and pprof's name for it


class PprofReport:
    binary = True

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        # samples carry a pid label always; offsets: locations are addresses anyway
        self.context = context
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: BinaryIO) -> None:
        out.write(gzip.compress(self.profile().SerializeToString(), mtime=0))

    def profile(self):
        """The Profile message (pprof_proto.Profile) of the stacks added."""
        # imported here: protobuf costs ~30 ms, paid only by runs that write pprof
        from .pprof_proto import Profile
        return _Builder(Profile(), self.context).build(self.counted)


def split_kernel(frames: tuple) -> tuple:
    """(kernel frames, user frames) of a stack's frames."""
    if SEPARATOR in frames:
        i = frames.index(SEPARATOR)
        return frames[:i], frames[i + 1:]
    return (), frames


def location_groups(frames) -> list:
    """Frames grouped by Location: the inlined calls at an address with the
    frame they were inlined into, which follows them."""
    groups, pending = [], []
    for f in frames:
        pending.append(f)
        if not f.inlined:
            groups.append(pending)
            pending = []
    if pending:                          # inlined frames with no caller after them
        groups.append(pending)
    return groups


class _Builder:
    def __init__(self, profile, context):
        self.p = profile
        self.command = getattr(context, "command", "count")
        self.frequency = getattr(context, "frequency", None)
        self.events = tuple(getattr(context, "events", ()))
        self.title = getattr(context, "title", "")
        self.objects = ObjectFacts()
        self.strings: dict = {}
        self.functions: dict = {}        # (name, system name, file) -> id
        self.locations: dict = {}        # (mapping key, addr, lines) -> id
        self.mapping_ids: dict = {}      # mapping key -> id
        self.mapping_msgs: dict = {}     # id -> Mapping message
        self.kernel_span = None          # (lowest, highest) kernel address seen
        self.s("")                       # string_table[0] must be ""

    def s(self, text: str) -> int:
        i = self.strings.get(text)
        if i is None:
            i = self.strings[text] = len(self.strings)
            self.p.string_table.append(text)
        return i

    def build(self, counted: list):
        stacks = [(sc, *split_kernel(sc.stack.frames)) for sc in counted]
        for sc, _kernel, user in stacks:          # load biases first, from any frame
            for f in user:
                if f.path:
                    self.objects.learn(sc.pid, f)
        self._mappings(stacks)
        events = self.events or tuple(dict.fromkeys(sc.event for sc in counted))
        many_events = len(events) > 1
        self._sample_types(events)
        period = self._period()
        samples: dict = {}
        for sc, kernel, user in stacks:
            ids = [self._location(("kernel",), g) for g in location_groups(kernel)]
            ids += [self._location(self._mapping_key(sc.pid, g[-1]), g)
                    for g in location_groups(user)]
            key = (tuple(ids), sc.pid, sc.comm, sc.event if many_events else "",
                   sc.stack.notes)
            samples[key] = samples.get(key, 0) + sc.count
        for (ids, pid, comm, event, notes), n in samples.items():
            sample = self.p.sample.add(location_id=ids,
                                       value=[n, n * period] if period else [n])
            sample.label.add(key=self.s("pid"), num=pid)
            sample.label.add(key=self.s("comm"), str=self.s(comm))
            if event:
                sample.label.add(key=self.s("event"), str=self.s(event))
            if notes:
                sample.label.add(key=self.s("note"), str=self.s("; ".join(notes)))
        if self.kernel_span:
            m = self.mapping_msgs[self.mapping_ids[("kernel",)]]
            m.memory_start, m.memory_limit = self.kernel_span[0], self.kernel_span[1] + 1
        if self.title:
            self.p.comment.append(self.s(self.title))
        return self.p

    # -- header -------------------------------------------------------------
    def _period(self) -> int:
        """Nanoseconds per sample of a profile run; 0 for counted events."""
        if self.command == "profile" and self.frequency:
            return 1_000_000_000 // self.frequency
        return 0

    def _sample_types(self, events: tuple) -> None:
        period = self._period()
        if period:
            self.p.sample_type.add(type=self.s("samples"), unit=self.s("count"))
            self.p.sample_type.add(type=self.s("cpu"), unit=self.s("nanoseconds"))
            self.p.period_type.type = self.s("cpu")
            self.p.period_type.unit = self.s("nanoseconds")
            self.p.period = period
        else:
            name = events[0] if len(events) == 1 and events[0] else "events"
            self.p.sample_type.add(type=self.s(name), unit=self.s("count"))

    # -- mappings -----------------------------------------------------------
    def _mapping_key(self, pid: int, f) -> tuple:
        """What one Mapping stands for: an object's executable segment in a
        process; the object in that process when the segment is unknown;
        none for a frame outside any file."""
        if not f.path:
            return ()
        return (pid, f.path, self.objects.segment(pid, f))

    def _mappings(self, stacks: list) -> None:
        """Number the mappings, the traced program's first, then as seen."""
        keys: dict = {}                               # key -> is the program's
        for sc, kernel, user in stacks:
            for f in user:
                key = self._mapping_key(sc.pid, f)
                if key and key not in keys:
                    keys[key] = os.path.basename(f.path).startswith(sc.comm[:15])
            if kernel:
                keys.setdefault(("kernel",), False)
        ordered = sorted(keys, key=lambda k: not keys[k])     # stable
        for i, key in enumerate(ordered, 1):
            self.mapping_ids[key] = i
            m = self.mapping_msgs[i] = self.p.mapping.add(id=i)
            if key == ("kernel",):
                m.filename = self.s(KERNEL_MAPPING)
                continue
            _pid, path, segment = key
            if segment:
                m.memory_start, m.memory_limit, m.file_offset = segment
            m.filename = self.s(path)
            m.build_id = self.s(self.objects.build_id(path))

    # -- locations ----------------------------------------------------------
    def _location(self, mapping_key: tuple, group: list) -> int:
        addr = group[-1].addr
        lines = tuple((self._function(f), f.line) for f in group if f.function)
        key = (mapping_key, addr, lines)
        i = self.locations.get(key)
        if i is None:
            i = self.locations[key] = len(self.locations) + 1
            mapping_id = self.mapping_ids.get(mapping_key, 0)
            loc = self.p.location.add(id=i, mapping_id=mapping_id, address=addr)
            for function_id, line in lines:
                loc.line.add(function_id=function_id, line=line)
            if mapping_id:
                self._resolution(self.mapping_msgs[mapping_id], group)
            if mapping_key == ("kernel",):
                lo, hi = self.kernel_span or (addr, addr)
                self.kernel_span = (min(lo, addr), max(hi, addr))
        return i

    @staticmethod
    def _resolution(m, group: list) -> None:
        """The Mapping's has_* flags: what its frames were resolved to."""
        named = [f for f in group if f.function]
        m.has_functions |= bool(named)
        m.has_filenames |= any(f.file for f in named)
        m.has_line_numbers |= any(f.line for f in named)
        m.has_inline_frames |= len(named) > 1

    def _function(self, f) -> int:
        system = self.objects.system_name(f) if f.path else f.function
        key = (f.function, system, f.file)
        i = self.functions.get(key)
        if i is None:
            i = self.functions[key] = len(self.functions) + 1
            self.p.function.add(id=i, name=self.s(f.function),
                                system_name=self.s(system), filename=self.s(f.file))
        return i
