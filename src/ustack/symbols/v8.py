"""Names of JS functions of a V8 process (node), read from its memory:
function, script, and the line: of the bytecode an interpreted frame was
at (its BytecodeArray's source positions), else of the function's start.

A JS frame in a stack is (SharedFunctionInfo's tagged address, bytecode
offset) (model.v8_frame_parts), put there by the in-kernel pass (bpf/v8.h).
V8's heap moves objects, so what sits at that address is checked each time
a frame is named: its map must say SharedFunctionInfo, and the memo is
keyed by the words that change when another function takes the address or
the function is recompiled (its name-or-ScopeInfo and script fields). A
frame whose function cannot be read (the process ended, the object moved
away) is shown as `[js 0x...]`, never with another function's name.
The layout is the process's V8's own (unwind/v8_runtime.py)."""
from __future__ import annotations

import bisect
import os
import struct
import threading
from collections import OrderedDict

from ..kernel.procfs import ProcessMemory, let_go
from ..model import V8_NO_OFFSET, Frame, printable
from ..unwind import v8_runtime
from .recorded_names import RecordedNames

MAX_FUNCTIONS = 1 << 16         # (pid, function, identity) memo entries
MAX_PROCESSES = 1024            # processes whose memory is kept open
UNLINED_TRIES = 4               # reads of a function whose script's lines were not found
MAX_TEXT = 1024                 # characters of a name or script name read at most
MAX_SOURCE = 16 << 20           # bytes of a script's source scanned for its lines
MAX_LINE_ENDS = 1 << 20         # entries of a script's line_ends read at most
SCOPE_SLOTS = 16                # ScopeInfo slots looked at past its context locals
MAX_TABLE = 1 << 18             # bytes of a bytecode source position table read at most
_CONS_DEPTH = 32                # ConsString halves followed at most
ANONYMOUS = "(anonymous)"       # as V8's own profiler names a function without one


class V8Functions:
    """The JS functions named so far, per process."""

    def __init__(self, live: bool = True):
        self._lock = threading.RLock()
        # pids are this host's processes, as they run (not a recording's:
        # another process may have its pid now, and is never read)
        self.live = live
        self._memo: OrderedDict = OrderedDict()   # (pid, shared, identity) -> (name, file, line)
        self._procs: dict = {}                     # pid -> _Process | None
        self._read: OrderedDict = OrderedDict()    # (pid, shared) -> as read while pid lived
        self.unnamed = 0           # frames shown as [js 0x...]
        # set by a capture whose kernel pass writes JS words (bpf/v8.h): in
        # any other stack (ftrace's or perf's frame-pointer walk) a word with
        # their tag is a garbage return address, not a JS frame
        self.active = False
        # set by that capture too: reads the functions the kernel saw, now
        self.refresh = None
        self._named_pids: set = set()
        # (pid, function, bytecode offset) -> names: a recording's
        self._recorded = RecordedNames(MAX_FUNCTIONS * 16)

    def named_in(self, pid: int) -> bool:
        """Whether a JS frame of pid was named from its heap."""
        return pid in self._named_pids

    @property
    def warnings(self) -> list:
        if not self.unnamed:
            return []
        if not self.live:
            return [f"{self.unnamed} JS frames are shown as [js 0x...]: the recording "
                    "does not name their function"]
        return [f"{self.unnamed} JS frames are shown as [js 0x...]: their function could "
                "not be read (their process ended, or V8 moved the function) when "
                "their stack was named"]

    def remember(self, pid: int, shared: int) -> None:
        """Read the function at `shared` in pid now, while pid lives (the
        capture's harvest of the functions the kernel saw): its stacks may
        be named after pid ended."""
        with self._lock:
            proc = self._process(pid)
            found = proc.function(shared) if proc is not None else None
            if found is not None:
                if len(self._read) >= MAX_FUNCTIONS:
                    self._read.popitem(last=False)
                self._read[(pid, shared)] = found

    def recorded(self, pid: int, parts: tuple, function: str, file: str, line: int) -> None:
        """A frame's names as a recording kept them (per bytecode offset: its line)."""
        self._recorded.add((pid, *parts), function, file, line)

    def frame(self, pid: int, shared: int, offset: int) -> Frame:
        found = self._recorded.script_frame((pid, shared, offset), "js")
        if found is not None:
            return found
        with self._lock:
            # only a process opened by remember(), while the kernel saw its
            # frames: its /proc/PID/mem stays that process's, where a pid
            # opened now may be another's since
            proc = self._procs.get(pid)
            found = proc.function(shared) if proc is not None else None
            if found is None and (proc is None or not proc.alive()):
                # gone: what was read while it lived
                found = self._read.get((pid, shared))
        if found is None:
            self.unnamed += 1
            return Frame(addr=0, module="", function=f"[js {shared:#x}]", kind="js")
        name, file, line, lines = found
        if offset != V8_NO_OFFSET and lines:      # interpreted: the bytecode's line
            at = bisect.bisect_right(lines, (offset, 1 << 62)) - 1
            if at >= 0:
                line = lines[at][1]
        self._named_pids.add(pid)
        return Frame(addr=0, module=printable(os.path.basename(file)) if file else "",
                     function=name, file=file, line=line, kind="js")

    def close(self) -> None:
        """The run is over: the processes read let go (their /proc/PID/mem
        descriptors); one asked again is opened anew."""
        with self._lock:
            let_go(self._procs)

    def _process(self, pid: int):
        if not self.live:
            return None
        if pid in self._procs:
            return self._procs[pid]
        from ..kernel import procfs
        proc = None
        try:
            runtime = v8_runtime.find_runtime(procfs.executable_mappings(pid))
            if runtime is not None:
                proc = _Process(pid, runtime, self._memo)
        except OSError:
            proc = None
        if len(self._procs) > MAX_PROCESSES:     # bounded: each holds its /proc/PID/mem
            let_go(self._procs)
        self._procs[pid] = proc
        return proc


class _Process:
    """One V8 process's memory, read through its layout."""

    def __init__(self, pid: int, runtime: v8_runtime.Runtime, memo: OrderedDict):
        self.pid = pid
        self.f = dict(runtime.layout)
        self.memo = memo
        self.mem = ProcessMemory(pid)
        self.first = 0                 # an address read before: whether the process lives
        self.line_ends: dict = {}      # (script, source word) -> [offsets]
        self.unlined: dict = {}        # memo key -> reads that found no lines

    def alive(self) -> bool:
        """Whether the process can still be read."""
        try:
            self.mem.read(self.first, 1)
            return True
        except OSError:
            return False

    def function(self, shared: int):
        """(name, script file, first line, bytecode_lines()) of the SharedFunctionInfo at
        tagged address `shared`, or None where none is there."""
        f = self.f
        try:
            if self.type_of(shared) != f["type_shared_function_info"]:
                return None
            at = shared - 1
            nsi = self.word(at + f["shared_name_or_scope_info"])
            script = self.word(at + f["shared_script_or_debug_info"])
        except (OSError, ValueError):      # unreadable, or no heap object there
            return None
        self.first = shared - 1
        key = (self.pid, shared, nsi, script)
        found = self.memo.get(key)
        if found is not None:
            return found
        try:
            found, lined = self._read(at, nsi, script)
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        if not lined:
            # its script's lines could not be read: a young script source
            # is moved by V8's scavenges, and a read that meets it mid-move
            # finds no string; read it again the next times asked (the
            # harvest asks again while the process runs), a few times
            tries = self.unlined.get(key, 0) + 1
            if tries < UNLINED_TRIES:
                if len(self.unlined) >= MAX_FUNCTIONS:
                    self.unlined.clear()
                self.unlined[key] = tries
                return found
            self.unlined.pop(key, None)
        if len(self.memo) >= MAX_FUNCTIONS:
            self.memo.popitem(last=False)
        self.memo[key] = found
        return found

    def _read(self, shared_at: int, nsi: int, script: int) -> tuple:
        """((name, file, first line, bytecode lines), whether its script's
        lines were read where they were wanted)."""
        f = self.f
        name, start = "", -1
        data = self.word(shared_at + f["shared_function_data"])
        kind = self.type_of(nsi)
        if kind < f["first_nonstring_type"]:
            name = self.string(nsi)
        elif kind == f["type_scope_info"]:
            name, start = self.scope_info(nsi)
        file, line, lines = "", 0, ()
        if self.is_heap(script) and self.type_of(script) == f["type_script"]:
            named = self.word(script - 1 + f["script_name"])
            if self.is_heap(named) and self.type_of(named) < f["first_nonstring_type"]:
                file = self.string(named)
            wanted = start >= 0 or data
            ends = self.script_line_ends(script) if wanted else []
            if ends and start >= 0:
                line = bisect.bisect_left(ends, start) + 1
            if ends:
                lines = self.bytecode_lines(data, ends)
            lined = bool(ends) or not wanted
        else:
            lined = True            # no script: no lines to read
        return (printable(name or ANONYMOUS), printable(file), line, lines), lined

    def bytecode_lines(self, data: int, ends: list) -> tuple:
        """((bytecode offset, line), ...) rising, the offset as an
        interpreted frame keeps it (from the tagged BytecodeArray), from the source position
        table of the function's BytecodeArray (its function_data `data`),
        () where it has none (not compiled to bytecode, or not kept).
        The table: pairs of zigzag VLQ deltas, the bytecode offset's
        negated (less one) for a position that is no statement; a
        position is the script offset << 1 (bit 0: external)."""
        f = self.f
        try:
            if not self.is_heap(data) or self.type_of(data) != f["type_bytecode_array"]:
                return ()
            table = self.word(data - 1 + v8_runtime.BYTECODE_SOURCE_POSITIONS)
            if not self.is_heap(table) or self.type_of(table) != f["type_byte_array"]:
                return ()
            n = self.smi(self.word(table - 1 + f["fixed_array_length"]))
            if not 0 < n <= MAX_TABLE:
                return ()
            raw = self.mem.read(table - 1 + f["fixed_array_data"], n)
        except (OSError, ValueError):
            return ()
        out, code, pos, i = [], 0, 0, 0
        while i < n:
            delta, i = _vlq(raw, i)
            code += delta if delta >= 0 else -delta - 1
            if i >= n:
                break
            delta, i = _vlq(raw, i)
            pos += delta
            if not pos & 1:                    # a script offset, not an external line
                out.append((code + f[v8_runtime.BYTECODE_HEADER], bisect.bisect_left(ends, (pos >> 1) & ((1 << 30) - 1)) + 1))
        return tuple(out)

    def scope_info(self, info: int) -> tuple:
        """(name, start position) from a ScopeInfo: past its fixed slots and
        context locals (names and infos), the first string is the
        function's name (its own, else the one V8 inferred), and the first
        pair of Smis rising after it its source range. V8 does not
        describe the slots between, which vary by version: these two are
        found, as the OTel profiler finds them. ("", -1) where not."""
        f = self.f
        data = info - 1 + f["heap_object_map"] + 8
        count = self.smi(self.word(data + 8 * f["scope_info_context_locals"]))
        first = f["scope_info_first_vars"] + 2 * max(count, 0)
        words = struct.unpack(f"<{SCOPE_SLOTS}Q", self.mem.read(data + 8 * first, 8 * SCOPE_SLOTS))
        name, prev = "", None
        for w in words:
            if not name and self.is_heap(w):
                try:
                    if self.type_of(w) < f["first_nonstring_type"]:
                        name = self.string(w)
                except (OSError, ValueError, UnicodeDecodeError):
                    pass
            if prev is not None and self.is_smi(w) and self.is_smi(prev):
                start, end = self.smi(prev), self.smi(w)
                if 0 <= start < end:
                    return name, start
            prev = w
        return name, -1

    def script_line_ends(self, script: int) -> list:
        """The offsets of the script's line ends: its line_ends array where
        V8 made one, else counted in its source (a flat or cons string)."""
        f = self.f
        ends_word = self.word(script - 1 + f["script_line_ends"])
        source = self.word(script - 1 + f["script_source"])
        key = (script, ends_word, source)
        if key in self.line_ends:
            return self.line_ends[key]
        ends = []
        if self.is_heap(ends_word) and self.type_of(ends_word) >= f["first_nonstring_type"]:
            at = ends_word - 1
            n = self.smi(self.word(at + f["fixed_array_length"]))
            if 0 < n <= MAX_LINE_ENDS:
                raw = self.mem.read(at + f["fixed_array_data"], 8 * n)
                ends = [w >> 32 for (w,) in struct.iter_unpack("<Q", raw) if self.is_smi(w)]
        if not ends and self.is_heap(source):
            try:
                text = self.string(source, MAX_SOURCE)
            except (OSError, ValueError, UnicodeDecodeError):
                text = ""
            ends = [i for i, c in enumerate(text) if c == "\n"]
            if text:
                ends.append(len(text))
        if not ends:
            return ends             # none read: asked again, read again
        if len(self.line_ends) > 256:
            self.line_ends.clear()
        self.line_ends[key] = ends
        return ends

    def string(self, tagged: int, limit: int = MAX_TEXT) -> str:
        """The V8 string at `tagged` (sequential, cons or thin), its first
        `limit` characters; ValueError for other kinds (external, sliced)."""
        f = self.f
        parts, todo, depth, size = [], [tagged], 0, 0
        while todo and size < limit:
            s = todo.pop()
            kind = self.type_of(s)
            if kind >= f["first_nonstring_type"]:
                raise ValueError("not a string")
            rep = kind & f["string_representation_mask"]
            at = s - 1
            if rep == f["thin_string_tag"]:
                todo.append(self.word(at + f["thin_actual"]))
            elif rep == f["cons_string_tag"]:
                depth += 1
                if depth > _CONS_DEPTH:
                    raise ValueError("a string too deep")
                todo.append(self.word(at + f["cons_second"]))
                todo.append(self.word(at + f["cons_first"]))
            elif rep == f["seq_string_tag"]:
                n = min(struct.unpack("<i", self.mem.read(at + f["string_length"], 4))[0],
                        limit - size)
                if n < 0:
                    raise ValueError("a negative length")
                if kind & f["string_encoding_mask"] == f["one_byte_string_tag"]:
                    parts.append(self.mem.read(at + f["seq_one_byte_chars"], n).decode("latin-1"))
                else:
                    parts.append(self.mem.read(at + f["seq_two_byte_chars"], 2 * n)
                                 .decode("utf-16-le", "replace"))
                size += n
            else:
                raise ValueError("a string kind not read")
        return "".join(parts)[:limit]

    def type_of(self, tagged: int) -> int:
        """The instance type of the heap object at `tagged`; ValueError for a Smi."""
        if not self.is_heap(tagged):
            raise ValueError("not a heap object")
        m = self.word(tagged - 1 + self.f["heap_object_map"])
        if not self.is_heap(m):
            raise ValueError("no map")
        return struct.unpack("<H", self.mem.read(m - 1 + self.f["map_instance_type"], 2))[0]

    def word(self, addr: int) -> int:
        return self.mem.word(addr)

    @staticmethod
    def is_heap(v: int) -> bool:
        return v & 3 == 1 and 0 < v < 1 << 47

    @staticmethod
    def is_smi(v: int) -> bool:
        return v & 0xFFFFFFFF == 0

    @staticmethod
    def smi(v: int) -> int:
        return struct.unpack("<i", struct.pack("<I", v >> 32))[0] if v & 0xFFFFFFFF == 0 else -1


def _vlq(raw: bytes, i: int) -> tuple:
    """(the zigzag VLQ int at raw[i:], the index after it)."""
    value = shift = 0
    while i < len(raw):
        b = raw[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return (value >> 1) ^ -(value & 1), i
