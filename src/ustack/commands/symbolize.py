"""`ustack symbolize`: saved ftrace output with `userstacktrace` (the ftrace recipe's
offline workflow), printed back with each user frame named:

     =>  <00005593e0f6a276> : d+0x16/0x70 [chain]
     => /tmp/chain[+0x276] : d+0x16/0x70 [chain]

The process may be long gone: its mappings come from a saved copy of
/proc/PID/maps (--maps), the live process (--pid), or one binary (--binary:
its absolute addresses are taken as its own link-time addresses, true of a
non-PIE executable). A `FILE[+0xOFF]` frame (sym-userobj) names FILE
itself; the offset counts from the start of the mapping, so the mapping's
file offset is added: from the maps when given, else the file's executable
PT_LOAD is assumed to be mapped as one piece (what ld.so and the kernel do).
Lines that are not user frames pass through unchanged."""
from __future__ import annotations

import os
import sys

from ..capture.ftrace_text import UserFrame, UserStackLines
from ..kernel import procfs
from ..model import Frame, Mapping, UstackError
from ..objfile.elf import ElfImage
from ..options import symbol_options
from ..report.text import frame_label
from ..symbols.symbolizer import SymbolOptions, Symbolizer
from ..target.mappings import ProcessMaps

_PAGE = 0x1000
_MAX_SEEN = 1 << 16         # frame lines whose naming is kept; bounds memory
_ANYWHERE = 1 << 64


class _TraceMaps:
    """find(key, addr) for the Symbolizer: key 0 is the process's mappings;
    each file named by a FILE[+0xOFF] frame without a known mapping gets a
    key of its own, mapped from address 0 so that addr = OFF."""

    def __init__(self, mappings):
        self.process = ProcessMaps(mappings)
        self.by_file: dict = {}         # path -> (key, Mapping) | None
        self.keys: dict = {}            # key -> Mapping

    def find(self, key: int, addr: int) -> Mapping | None:
        if key == 0:
            return self.process.find(addr)
        return self.keys.get(key)

    def place(self, frame: UserFrame) -> tuple | None:
        """(key, address) of a FILE[+0xOFF] frame."""
        for m in self.process.maps:     # the exact mapping when the maps are known
            if m.path == frame.path and frame.offset < m.end - m.start:
                return 0, m.start + frame.offset
        if frame.path not in self.by_file:
            self.by_file[frame.path] = self._assumed_mapping(frame.path)
        placed = self.by_file[frame.path]
        return (placed[0], frame.offset) if placed else None

    def _assumed_mapping(self, path: str) -> tuple | None:
        try:
            segments = ElfImage.open(path).executable_segments()
        except UstackError:
            return None
        if len(segments) != 1:          # which one the offset counts in is unknown
            return None
        key = -1 - len(self.keys)
        self.keys[key] = Mapping(0, _ANYWHERE, segments[0][1] & ~(_PAGE - 1), path)
        return key, self.keys[key]


def _mappings(pid: int | None, maps_file: str | None, binary: str | None) -> list:
    if pid is not None:
        found = procfs.executable_mappings(pid)
        if not found:
            if procfs.process_exists(pid):
                raise UstackError(f"cannot read the mappings of process {pid}")
            raise UstackError(f"no such process: {pid} (a saved copy of its "
                              "/proc/PID/maps can be given with --maps)")
        return found
    if maps_file is not None:
        try:
            with open(maps_file, errors="replace") as f:
                text = f.read(64 << 20)
        except OSError as e:
            raise UstackError(f"{maps_file}: {e.strerror}") from None
        try:
            found = procfs.parse_maps(text)
        except ValueError as e:
            raise UstackError(f"{maps_file}: not a /proc/PID/maps file: {e}") from None
        if not found:
            raise UstackError(f"{maps_file}: no executable mappings in it")
        return found
    image = ElfImage.open(binary)           # UstackError for a missing/corrupt file
    if image.file.is_pie:
        return []                           # its absolute addresses are randomized
    return [Mapping(v & ~(_PAGE - 1), v + size, off & ~(_PAGE - 1), binary)
            for v, off, size in image.file.executable_segments()]


def main(args) -> int:
    """`ustack symbolize` from its parsed arguments."""
    return symbolize_trace(args.trace_file, pid=args.pid, maps_file=args.maps,
                           binary=args.binary, options=symbol_options(args))


def symbolize_trace(trace_file: str, pid: int | None = None,
                    maps_file: str | None = None, binary: str | None = None,
                    options: SymbolOptions = SymbolOptions(),
                    out=None, err=None) -> int:
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr
    maps = _TraceMaps(_mappings(pid, maps_file, binary))
    warn_pie = binary is not None and not maps.process.maps
    symbolizer = Symbolizer(maps, options)
    lines = UserStackLines()
    seen: dict = {}         # (frame line, leaf?) -> its lines named: traces repeat frames
    try:
        f = sys.stdin.buffer if trace_file == "-" else open(trace_file, "rb")
    except OSError as e:
        raise UstackError(f"{trace_file}: {e.strerror}") from None
    with f:
        for raw in f:
            line = raw.decode("utf-8", "surrogateescape").rstrip("\r\n")
            frame = lines.frame(line)
            if frame is None:
                out.write(raw)
                continue
            if warn_pie and frame.path is None:
                print(f"ustack: {binary} is position-independent: its absolute "
                      "addresses cannot be named without --pid or --maps "
                      "(sym-userobj's FILE[+0xOFF] frames can)", file=err)
                warn_pie = False
            head = line.rstrip()
            key = (head, frame.index == 0)
            named = seen.get(key)
            if named is None:
                named = "".join(f"{head} : {frame_label(fr)}\n"
                                for fr in _frames(symbolizer, maps, frame)
                                ).encode("utf-8", "surrogateescape")
                if len(seen) >= _MAX_SEEN:
                    seen.clear()
                seen[key] = named
            out.write(named)
    out.flush()
    for warning in symbolizer.warnings:
        print(f"ustack: {warning}", file=err)
    return 0


def _frames(symbolizer: Symbolizer, maps: _TraceMaps, frame: UserFrame) -> tuple:
    key, addr = 0, frame.addr
    if frame.path is not None:
        placed = maps.place(frame)
        if placed is not None:
            key, addr = placed
    if addr is None:                    # a file we cannot open or place
        return (Frame(addr=0, module=os.path.basename(frame.path or "")),)
    # the first frame is where the thread was; the others return addresses
    return symbolizer.frames(key, [addr], leaf_is_exact=frame.index == 0)
