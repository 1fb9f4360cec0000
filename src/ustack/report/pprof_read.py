"""A pprof file ustack wrote (report/pprof.py), read back as the
StackCounts it was made of: `report --from DIR/` sums the files of
`--every` with these. What a file keeps is what comes back: per sample
its pid, comm, event and notes (labels), per frame its function, source
file, line, object and whether it was inlined (a Location's Lines, the
inlined calls first); the interval's start and length (time_nanos,
duration_nanos) and its comments."""
from __future__ import annotations

import gzip
import os
import zlib

from ..model import Frame, Stack, StackCount, UstackError
from ..symbols.kernel import KERNEL_MODULE
from ..symbols.stacks import SEPARATOR
from ..values import value
from .pprof import KERNEL_MAPPING


@value
class PprofFile:
    """One file: its interval and what it counted."""
    start_ns: int
    duration_ns: int
    comments: tuple
    counts: tuple                    # StackCounts, pid always kept


class Shared:
    """What the files of one directory share: a location's frames and a
    stack made once for all of them (the same code, file after file), so
    that a report names each once (formats memoize by object)."""

    LIMIT = 500_000                  # entries of each; past it, started afresh

    def __init__(self):
        self.locations: dict = {}    # a location's content -> (kernel's, its frames)
        self.stacks: dict = {}       # its locations' (by identity) and notes -> Stack

    def location(self, key: tuple, made) -> tuple:
        found = self.locations.get(key)
        if found is None:
            if len(self.locations) >= self.LIMIT:
                self.locations.clear()
                self.stacks.clear()  # (keyed by the identity of what was cleared)
            found = self.locations[key] = made()
        return found

    def stack(self, located: tuple, notes: tuple) -> Stack:
        key = (tuple(map(id, located)), notes)
        found = self.stacks.get(key)
        if found is None:
            if len(self.stacks) >= self.LIMIT:
                self.stacks.clear()
            found = self.stacks[key] = _stack(located, notes)
        return found


def read_pprof(path: str, data: bytes, shared: Shared | None = None) -> PprofFile:
    """`data`, the bytes of `path` (gzip'd profile.proto); a one-line
    UstackError when it is not one. `shared`: what files read before it
    made, used again."""
    shared = shared or Shared()
    from .pprof_proto import Profile     # protobuf: paid only by readers
    try:
        raw = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        p = Profile.FromString(raw)
    except (OSError, EOFError, zlib.error, ValueError, Exception) as e:   # protobuf's DecodeError
        raise UstackError(f"{path}: not a pprof file ({type(e).__name__})") from None
    if not p.sample_type:
        raise UstackError(f"{path}: not a pprof file (no sample types)")
    names = list(p.string_table)        # (a protobuf list's len() costs ~4 us)
    count = len(names)

    def text(i: int) -> str:
        return names[i] if 0 <= i < count else ""
    functions = {f.id: (text(f.name), text(f.system_name), text(f.filename))
                 for f in p.function}
    mappings = {}
    for m in p.mapping:                  # path, module, kernel's
        path = text(m.filename)
        kernel = path == KERNEL_MAPPING
        mappings[m.id] = ("" if kernel else path,
                          KERNEL_MODULE if kernel else os.path.basename(path), kernel)
    locations = {}
    for loc in p.location:
        lines = tuple((functions.get(line.function_id, _NO_FUNCTION), line.line)
                      for line in loc.line)
        mapping = mappings.get(loc.mapping_id, _NO_MAPPING)
        locations[loc.id] = shared.location(
            (loc.address, mapping, lines), lambda: _frames(loc.address, lines, mapping))
    default_event = _event(p, text)
    counts = []
    stacks: dict = {}
    for s in p.sample:
        labels = {text(label.key): (text(label.str) if label.str else label.num)
                  for label in s.label}
        ids = tuple(s.location_id)
        notes = tuple(str(labels["note"]).split("; ")) if labels.get("note") else ()
        stack = stacks.get((ids, notes))
        if stack is None:
            stack = stacks[(ids, notes)] = shared.stack(
                tuple(locations.get(i, _NOWHERE) for i in ids), notes)
        event = labels.get("event") or default_event
        counts.append(StackCount(str(labels.get("comm", "")), int(labels.get("pid") or 0),
                                 stack, int(s.value[0]) if s.value else 0, str(event)))
    return PprofFile(p.time_nanos, p.duration_nanos,
                     tuple(text(c) for c in p.comment), tuple(counts))


def _event(p, text) -> str:
    """The event of samples without an `event` label: `profile:hz:N` of a
    profile (its period), else the one sample type's name (a count of one
    event names its type after it)."""
    if text(p.period_type.type) == "cpu" and p.period > 0:
        return f"profile:hz:{round(1e9 / p.period)}"
    return text(p.sample_type[0].type)


_NO_MAPPING = ("", "", False)
_NO_FUNCTION = ("", "", "")
_NOWHERE = (False, ())                   # a location id the file does not have


def _frames(address: int, lines: tuple, mapping: tuple) -> tuple:
    """(kernel's, a Location's frames, innermost first): its inlined calls,
    then the function they were inlined into."""
    path, module, kernel = mapping
    frames = []
    last = len(lines) - 1
    for i, ((name, system, file), line) in enumerate(lines):
        if system.startswith("py::"):            # a Python frame (pprof.py's system name)
            frames.append(Frame(0, os.path.basename(file), function=name, file=file,
                                line=line, kind="python"))
            continue
        named = _unnamed(name, module)
        frames.append(Frame(address, module, path=path, file=file, line=line,
                            inlined=i < last, **(named or {"function": name})))
    if not frames:                               # an address no function names
        frames.append(Frame(address, module, path=path))
    return kernel, tuple(frames)


def _unnamed(name: str, module: str) -> dict | None:
    """pprof.py names unnamed code `fn@0x11e0 [prog]` (or `0x11f6 [prog]`):
    the frame without a name but with its place, as it was live."""
    suffix = f" [{module}]"
    if not name.endswith(suffix):
        return None
    head = name[:-len(suffix)]
    for prefix, start in (("fn@0x", True), ("0x", False)):
        if head.startswith(prefix):
            try:
                where = int(head[len(prefix):], 16)
            except ValueError:
                return None
            return {"function": None, "objaddr": where, "objstart": where if start else 0}
    return None


def _stack(located: tuple, notes: tuple) -> Stack:
    """The stack of a sample's locations (leaf first, each (kernel's,
    frames)); kernel frames, first, end at the separator, as live stacks
    have them."""
    frames: list = []
    kernel_seen = False
    for kernel, at in located:
        if kernel_seen and not kernel:
            frames.append(SEPARATOR)
            kernel_seen = False
        kernel_seen = kernel_seen or kernel
        frames.extend(at)
    return Stack(tuple(frames), notes)
