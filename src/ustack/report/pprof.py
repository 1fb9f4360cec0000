"""`-f pprof`: a gzip-compressed profile.proto (`.pb.gz`, `.pprof`), what
`go tool pprof`, Pyroscope, Parca and Grafana read.

- Sample types: an `offcpu` run has `offcpu/nanoseconds` (the time off
  the CPU); a `profile` run has `samples/count` and `cpu/nanoseconds`
  (count × 1e9/Hz; period_type cpu/nanoseconds, period 1e9/Hz); a `count`
  run has `<event>/count` for one event, else `events/count` with an
  `event` label on each sample; a `count --weight EXPR` run has
  `EXPR/bytes` where it sums a byte count, else `EXPR/count`.
- Labels: `pid` (a number), `comm`, and `note` when the unwinder left one.
- Functions: the shown name, the linkage (mangled) name as system_name
  when the object's symbol table has it, the source file with --lines.
- Locations: the runtime address, its mapping, and a Line per function
  at that address: the calls inlined there first (--inlines), the
  function they were inlined into last, each with its line (--lines). A
  frame no symbol names has one line of a function `fn@0x11e0 [prog]`
  (its CFI's start, else `0x11f6 [prog]`, its address in the object), so
  that unnamed functions stay apart; its mapping says it has no functions,
  so pprof may name it from the object, which the build-id identifies.
- Mappings: per process and object, the executable segment's memory
  start, limit and file offset when a frame told the object's load bias
  (a named one, or an unnamed one's address in the object: pprof_objects.py),
  else zeros; the path as the process saw it;
  the GNU build-id in hex. Kernel frames (--kernel) belong to one
  `[kernel.kallsyms]` mapping spanning the kernel addresses seen.
  The first mapping is the traced program's (pprof calls it the main
  binary): the object named like the process.
- time_nanos: when the report was made ready to take stacks, i.e. the
  run's start when the report is made first (Parca files a profile under
  this time); the command line as a comment. `profile --every`: each
  file's time_nanos and duration_nanos are its interval's, within which
  every one of its samples was taken (counting/intervals.py), and
  comments say what ustack itself cost over it (and, for a last interval
  cut short, that it is partial)."""
from __future__ import annotations

import gzip
import os
import time
from io import BufferedIOBase

from ..model import SCRIPT_KINDS, StackCount, unnamed_function
from .pprof_objects import ObjectFacts, split_kernel
from .formats import weight_of
from .text import is_timed

# a script frame's system name starts with its language (Python's: perf's)
_SCRIPT_PREFIX = {"python": "py", "php": "php", "perl": "pl", "ruby": "rb"}

KERNEL_MAPPING = "[kernel.kallsyms]"     # perf's and pprof's name for it
HOST_COMMENT = "host: "     # --every: the comment naming the machine (report --from DIR/ --host)


class PprofReport:
    binary = True

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        # samples carry a pid label always; offsets: locations are addresses anyway
        self.context = context
        self.counted: list = []
        # the run's start (Parca files a profile under it), else now
        self.time_ns = getattr(context, "start_ns", None) or time.time_ns()

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: BufferedIOBase) -> None:
        data = self.profile().SerializeToString()
        out.write(gzip.compress(data, compresslevel=6, mtime=0))   # 4x faster than 9

    def profile(self):
        """The Profile message (pprof_proto.Profile) of the stacks added."""
        # imported here: protobuf costs ~30 ms, paid only by runs that write pprof
        from .pprof_proto import Profile
        profile = Profile(time_nanos=self.time_ns)
        return _Builder(profile, self.context).build(self.counted)


def location_groups(frames) -> list:
    """Frames grouped by Location: the inlined calls at an address with the
    frame they were inlined into, which follows them."""
    if not any(f.inlined for f in frames):
        return [(f,) for f in frames]
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
        self.comments = tuple(getattr(context, "comments", ()))
        self.duration_ns = getattr(context, "duration_ns", 0)
        self.timed = is_timed(context)
        self.bytes = getattr(context, "value_unit", None) == "bytes"
        self.weight = weight_of(context)
        self.objects = ObjectFacts()
        self.strings: dict = {}
        self.functions: dict = {}        # (name, object path, source file) -> id
        self.locations: dict = {}        # (pid or None for the kernel, frame…) -> id
        self.placed: list = []           # (Location message, mapping key)
        self.mappings: dict = {}         # mapping key -> [is the program's, Frames seen]
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
        events = self.events or tuple(dict.fromkeys(sc.event for sc in counted))
        many_events = len(events) > 1
        self._sample_types(events)
        period = self._period()
        samples: dict = {}
        for sc, kernel, user in stacks:
            ids = [self._location(sc, g, True) for g in location_groups(kernel)]
            ids += [self._location(sc, g) for g in location_groups(user)]
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
        self._mappings()
        for line in (self.title, *self.comments):
            if line:
                self.p.comment.append(self.s(line))
        if self.duration_ns:
            self.p.duration_nanos = self.duration_ns
        return self.p

    # -- header -------------------------------------------------------------
    def _period(self) -> int:
        """Nanoseconds per sample of a profile run; 0 for counted events."""
        if self.timed:
            return 0
        if self.command == "profile" and self.frequency:
            return 1_000_000_000 // self.frequency
        return 0

    def _sample_types(self, events: tuple) -> None:
        period = self._period()
        if self.timed:                   # offcpu: one value, the time off the CPU
            self.p.sample_type.add(type=self.s("offcpu"), unit=self.s("nanoseconds"))
        elif self.weight is not None:    # count --weight: the argument's sums
            self.p.sample_type.add(type=self.s(self.weight.expr),
                                   unit=self.s(self.weight.unit or "count"))
        elif self.bytes:                 # memleak: bytes not freed, as heap profiles say
            self.p.sample_type.add(type=self.s("inuse_space"), unit=self.s("bytes"))
        elif period:
            self.p.sample_type.add(type=self.s("samples"), unit=self.s("count"))
            self.p.sample_type.add(type=self.s("cpu"), unit=self.s("nanoseconds"))
            self.p.period_type.type = self.s("cpu")
            self.p.period_type.unit = self.s("nanoseconds")
            self.p.period = period
        else:
            name = events[0] if len(events) == 1 and events[0] else "events"
            self.p.sample_type.add(type=self.s(name), unit=self.s("count"))

    # -- locations ----------------------------------------------------------
    def _location(self, sc: StackCount, group: list, kernel: bool = False) -> int:
        """The id of the Location of a group of frames (location_groups)."""
        f = group[-1]
        # what tells locations apart, in fields quick to hash (a Frame's
        # hash is computed anew each time)
        key = (None if kernel else sc.pid, f.addr, f.path, f.function, f.file, f.line,
               tuple((g.function, g.line) for g in group[:-1]) if len(group) > 1 else ())
        i = self.locations.get(key)
        if i is not None:
            return i
        i = self.locations[key] = len(self.locations) + 1
        loc = self.p.location.add(id=i, address=f.addr)
        for g in group:
            if g.function:
                loc.line.add(function_id=self._function(g, sc.pid), line=g.line)
            elif unnamed_function(g):        # apart from other unnamed code
                loc.line.add(function_id=self._unnamed_function(g))
        if kernel:
            mapping_key = ("kernel",)
            lo, hi = self.kernel_span or (f.addr, f.addr)
            self.kernel_span = (min(lo, f.addr), max(hi, f.addr))
        elif f.path:
            # an object's executable segment in a process; the object in that
            # process when the segment is unknown
            mapping_key = (sc.pid, f.path, self.objects.segment(sc.pid, f))
        else:
            return i                                 # outside any file: no mapping
        self.placed.append((loc, mapping_key))
        seen = self.mappings.get(mapping_key)
        if seen is None:
            program = not kernel and os.path.basename(f.path).startswith(sc.comm[:15])
            seen = self.mappings[mapping_key] = [program, []]
        seen[1].extend(group)
        return i

    def _function(self, f, pid: int | None = None) -> int:
        key = (f.function, f.path, f.file)
        i = self.functions.get(key)
        if i is None:
            i = self.functions[key] = len(self.functions) + 1
            if f.kind in SCRIPT_KINDS:
                # perf's name of a Python function (3.12's trampolines); a
                # name unlike `name` also keeps pprof from reading <module>
                # as C++ template arguments and dropping it
                system = f"{_SCRIPT_PREFIX.get(f.kind, f.kind)}::{f.function}:{f.file}"
            else:
                system = self.objects.system_name(f, pid) if f.path else f.function
            self.p.function.add(id=i, name=self.s(f.function),
                                system_name=self.s(system), filename=self.s(f.file))
        return i

    def _unnamed_function(self, f) -> int:
        """A Function for code no symbol names, `fn@0x11e0 [prog]`: pprof
        would otherwise count all of an object's unnamed code as one
        `[prog]`. Its mapping still says it has no functions, so pprof may
        name it from the object later."""
        name = f"{unnamed_function(f)} [{f.module}]"
        key = (name, f.path, "")
        i = self.functions.get(key)
        if i is None:
            i = self.functions[key] = len(self.functions) + 1
            self.p.function.add(id=i, name=self.s(name), system_name=self.s(name))
        return i

    # -- mappings -----------------------------------------------------------
    def _mappings(self) -> None:
        """The Mappings, the traced program's first (pprof's main binary),
        then as seen; each Location given its mapping's id."""
        ordered = sorted(self.mappings, key=lambda k: not self.mappings[k][0])  # stable
        ids = {key: i for i, key in enumerate(ordered, 1)}
        for key in ordered:
            m = self.p.mapping.add(id=ids[key])
            if key == ("kernel",):
                m.filename = self.s(KERNEL_MAPPING)
                m.memory_start = self.kernel_span[0]
                m.memory_limit = self.kernel_span[1] + 1
            else:
                _pid, path, segment = key
                if segment:
                    m.memory_start, m.memory_limit, m.file_offset = segment
                m.filename = self.s(path)
                m.build_id = self.s(self.objects.build_id(path))
            # what the frames of this mapping were resolved to
            named = [f for f in self.mappings[key][1] if f.function]
            m.has_functions = bool(named)
            m.has_filenames = any(f.file for f in named)
            m.has_line_numbers = any(f.line for f in named)
            m.has_inline_frames = any(f.inlined for f in named)
        for loc, key in self.placed:
            loc.mapping_id = ids[key]
