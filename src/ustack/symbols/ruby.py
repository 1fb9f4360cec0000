"""Names of Ruby frames, read from a Ruby process's memory: the label
Ruby's own backtraces show (`c`, `block in a`, `<main>`), a method's
with its class as Ruby 3.4's show it (`Worker#c`, `Worker.build` for a
singleton method), the file, and the line of the instruction the frame
was at.

A Ruby frame in a stack is (iseq body address, pc index)
(model.ruby_frame_parts), put there by the in-kernel pass (bpf/ruby.h),
which also lists each (process, body) it saw for the capture to read here
while the process lives (remember). An iseq is freed and another made at
its address as a program runs, so a body is read again when its label
object changed; a frame whose body cannot be read (the process ended
before it was read) is shown as `[ruby 0x...]`, never with another
iseq's name. The layout is the process's VM's own (unwind/ruby_runtime.py).

The class: an iseq does not know it (a method's iseq has no parent); the
kernel copies a method frame's method entry with the iseq, whose owner
is the class or module the method is in (or a singleton class, whose
`__attached__` is the class). A named class keeps its path, a frozen
String, among its instance variables (`__classpath__`); a method whose
owner cannot be read, or is anonymous, keeps its bare label. A block is
named by its method's class (`block in Worker#c`) when that method's
frame was read first (its local_iseq: the capture reads methods first).

The line: Ruby 3.1 keeps an iseq's lines as (line, node, events) entries
and finds an instruction's entry through a succinct bit vector (iseq.c's
succ_index_table): its rank of the instruction's position."""
from __future__ import annotations

import os
import re
import struct
import threading
from collections import OrderedDict

from ..kernel.procfs import ProcessMemory, let_go
from ..model import Frame, printable
from ..objfile.mapped import object_path
from ..unwind import ruby_runtime
from .recorded_names import RecordedNames

MAX_ISEQS = 1 << 16             # (pid, body) entries kept
MAX_PROCESSES = 1024            # processes whose memory is kept open
MAX_TEXT = 1024                 # bytes of a name read at most
MAX_POSITIONS = 1 << 20         # instructions of an iseq whose lines are read at most
T_MASK, T_STRING, T_ARRAY = 0x1F, 0x05, 0x07
ISEQ_BLOCK = 2                  # enum iseq_type
T_CLASS, T_MODULE, T_IMEMO = 0x02, 0x03, 0x1A
FL_FREEZE, FL_SINGLETON = 1 << 11, 1 << 12
IMEMO_SHIFT, IMEMO_MASK, IMEMO_MENT = 12, 0x0F, 6     # imemo_ment: a method entry
MAX_IVARS = 64                  # a class's instance variables looked through at most
ST_ENTRY = struct.Struct("<QQQ")                 # st_table_entry: hash, key, record
ST_DELETED = (1 << 64) - 1                       # a deleted entry's hash
CONSTANT_PATH = re.compile(r"[A-Z]\w*(?:::[A-Z]\w*)*")
STRING_NOEMBED = 1 << 13        # RSTRING_NOEMBED (FL_USER1)
EMBED_LEN_SHIFT, EMBED_LEN_MASK = 14, 0x1F   # 3.1's RSTRING_EMBED_LEN_*
ARRAY_EMBED = 1 << 13           # RARRAY_EMBED_FLAG
# succ_index_table (iseq.c): an immediate part for the first positions,
# then 512-position blocks
IMMEDIATE_TABLE_SIZE = 54
IMMEDIATE_PART_WORDS = 6        # IMMEDIATE_TABLE_SIZE / 9
SUCC_BLOCK = struct.Struct("<IxxxxQ8Q")     # rank, small_block_ranks, bits[8]


class RubyIseqs:
    """The Ruby iseqs named so far, per process."""

    def __init__(self, live: bool = True):
        self._lock = threading.RLock()
        self.live = live
        # (pid, body) -> (label object, (name, file, first, lines), method entry)
        self._read: OrderedDict = OrderedDict()
        self._procs: dict = {}                     # pid -> _Process | None
        self.unnamed = 0
        # set by a capture whose kernel pass writes Ruby words (bpf/ruby.h)
        self.active = False
        # set by that capture too: reads the iseqs the kernel saw, now
        self.refresh = None
        # (pid, body, pc index) -> names: a recording's
        self._recorded = RecordedNames(MAX_ISEQS * 16)

    @property
    def warnings(self) -> list:
        if not self.unnamed:
            return []
        return [f"{self.unnamed} Ruby frames are shown as [ruby 0x...]: their method could "
                "not be read (their process ended first) when their stack was named"]

    def remember(self, pid: int, body: int, label: int, method_entry: int = 0) -> None:
        """Read the iseq at `body` in pid now, while pid lives, unless it
        was read with this label object already; `method_entry`: of the
        method's frame it ran in (its class), or 0."""
        with self._lock:
            known = self._read.get((pid, body))
            # again with a method entry where it was read without one (named
            # as a stack came, before the capture took the kernel's copy)
            if known is not None and known[0] == label and (known[2] or not method_entry):
                return
            proc = self._process(pid)
            found = proc.iseq(body, method_entry) if proc is not None else None
            if found is not None:
                if len(self._read) >= MAX_ISEQS:
                    self._read.popitem(last=False)
                self._read[(pid, body)] = (label, found, method_entry)

    def recorded(self, pid: int, parts: tuple, function: str, file: str, line: int) -> None:
        """A frame's names as a recording kept them (per pc: its line)."""
        self._recorded.add((pid, *parts), function, file, line)

    def frame(self, pid: int, body: int, index: int) -> Frame:
        found = self._recorded.script_frame((pid, body, index), "ruby")
        if found is not None:
            return found
        with self._lock:
            known = self._read.get((pid, body))
            if known is None and pid not in self._procs and self.refresh is not None:
                # not harvested yet (a trace names each stack as it comes)
                self.refresh()
                known = self._read.get((pid, body))
            if known is None:
                # read now, from a process opened by remember() while the
                # kernel saw its frames (a pid opened now may be another
                # process's since)
                proc = self._procs.get(pid)
                label = proc.label(body) if proc is not None else None
                if label is not None:
                    self.remember(pid, body, label)
                    known = self._read.get((pid, body))
        if known is None:
            self.unnamed += 1
            return Frame(addr=0, module="", function=f"[ruby {body:#x}]", kind="ruby")
        name, file, first, lines = known[1]
        line = line_at(lines, index) or first
        return Frame(addr=0, module=printable(os.path.basename(file)) if file else "",
                     function=name, file=file, line=line, kind="ruby")

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
            for m in procfs.executable_mappings(pid):
                path = object_path(m)
                runtime = ruby_runtime.object_runtime(path) if path else None
                if runtime is not None:
                    proc = _Process(pid, runtime)
                    break
        except OSError:
            proc = None
        if len(self._procs) > MAX_PROCESSES:      # bounded: each holds its /proc/PID/mem
            let_go(self._procs)
        self._procs[pid] = proc
        return proc


def line_at(lines, index: int) -> int:
    """The line of the instruction before pc index `index` (Ruby's pc
    points after the running instruction), 0 when not known."""
    if not lines:
        return 0
    pos = index - 1 if index else 0
    return lines(pos)


class _Process:
    """One Ruby process's memory, read through its VM's layout."""

    def __init__(self, pid: int, runtime: ruby_runtime.Runtime):
        self.f = dict(runtime.layout)
        self.mem = ProcessMemory(pid)
        # a method's iseq body -> its label with its class (Worker#c), for
        # its blocks; bounded as the names read are
        self.methods: OrderedDict = OrderedDict()

    def label(self, body: int) -> int | None:
        """The label object of the iseq body at `body` (what tells it from
        another made there later), None where it cannot be read."""
        try:
            return self.mem.word(body + self.f["body_location"] + self.f["location_label"])
        except OSError:
            return None

    def iseq(self, body: int, method_entry: int = 0):
        """(label, file, first line, lines(pos) or None) of the iseq body
        at `body`, or None where it cannot be read; the label with the
        class of `method_entry`, where it is one."""
        f = self.f
        try:
            loc = body + f["body_location"]
            label = self.string(self.mem.word(loc + f["location_label"]))
            file = self.path(self.mem.word(loc + f["location_pathobj"]))
            first = self.mem.word(loc + f["location_first_lineno"]) >> 1   # a Fixnum
            if not 0 < first < 1 << 31:
                # not a line (an iseq freed and reused under the read):
                # one a recording's i32, pprof and ClickHouse refuse
                first = 0
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        try:
            lines = self.lines(body)
        except (OSError, ValueError, struct.error):
            lines = None
        if method_entry:
            method = label
            label = self.with_class(method_entry, label)
            if label != method:
                if len(self.methods) >= MAX_ISEQS:
                    self.methods.popitem(last=False)
                self.methods[body] = (method, label)
        else:
            label = self.in_method(body, label)
        return printable(label), printable(file), first, lines

    def in_method(self, body: int, label: str) -> str:
        """A block's label with its method's class (`block in Worker#c`),
        where that method was read with it; else as it is."""
        if not self.methods or not label.startswith("block "):
            return label
        try:
            if struct.unpack("<I", self.mem.read(body + self.f["body_type"], 4))[0] != ISEQ_BLOCK:
                return label
            local = self.mem.word(body + self.f["body_local_iseq"])
            method = self.methods.get(self.mem.word(local + self.f["iseq_body"])) if local else None
        except OSError:
            return label
        if method is None or not label.endswith(" in " + method[0]):
            return label
        return label[:len(label) - len(method[0])] + method[1]

    def with_class(self, method_entry: int, label: str) -> str:
        """`Class#label` (`Class.label` for a singleton method) of the
        method entry's owner; the label as it is where that cannot be read."""
        try:
            flags = self.mem.word(method_entry)
            if flags & T_MASK != T_IMEMO or (flags >> IMEMO_SHIFT) & IMEMO_MASK != IMEMO_MENT:
                return label
            owner = self.mem.word(method_entry + self.f["me_owner"])
            if self.mem.word(owner) & FL_SINGLETON:
                attached = self.ivar(owner, lambda v: self.class_path(v) is not None)
                path = self.class_path(attached) if attached else None
                return f"{path}.{label}" if path else label
            path = self.class_path(owner)
            return f"{path}#{label}" if path else label
        except (OSError, ValueError, UnicodeDecodeError, struct.error):
            return label

    def class_path(self, klass: int) -> str | None:
        """A named class's or module's path (`Outer::Inner`), else None."""
        flags = self.mem.word(klass)
        if flags & T_MASK not in (T_CLASS, T_MODULE) or flags & FL_SINGLETON:
            return None
        path = self.ivar(klass, self.is_path)
        return self.string(path) if path else None

    def is_path(self, v: int) -> bool:
        flags = self.mem.word(v)
        return (flags & T_MASK == T_STRING and bool(flags & FL_FREEZE)
                and CONSTANT_PATH.fullmatch(self.string(v)) is not None)

    def ivar(self, klass: int, wanted) -> int:
        """The first value of the class's instance variables (its iv_tbl,
        an st_table) that `wanted` takes, 0 when none."""
        ext = self.mem.word(klass + self.f["class_ext"])
        table = self.mem.word(ext + self.f["ext_iv_tbl"]) if ext else 0
        if not table:
            return 0
        start, bound, entries = struct.unpack("<QQQ", self.mem.read(table + 32, 24))
        if not entries or bound < start or bound - start > MAX_IVARS:
            return 0
        raw = self.mem.read(entries + ST_ENTRY.size * start, ST_ENTRY.size * (bound - start))
        for hash_, _key, value in ST_ENTRY.iter_unpack(raw):
            if hash_ != ST_DELETED and value and not value & 7:
                try:
                    if wanted(value):
                        return value
                except (OSError, ValueError, UnicodeDecodeError):
                    continue
        return 0

    def string(self, v: int) -> str:
        flags = self.mem.word(v)
        if flags & T_MASK != T_STRING:
            raise ValueError("not a String")
        if flags & STRING_NOEMBED:
            n = self.mem.word(v + 16)
            ptr = self.mem.word(v + 24)
        else:
            n = (flags >> EMBED_LEN_SHIFT) & EMBED_LEN_MASK
            ptr = v + 16
        return self.mem.read(ptr, min(n, MAX_TEXT)).decode("utf-8", "replace") if n else ""

    def path(self, v: int) -> str:
        """An iseq's pathobj: a String, or [path, realpath] (the path shown)."""
        flags = self.mem.word(v)
        if flags & T_MASK == T_STRING:
            return self.string(v)
        if flags & T_MASK != T_ARRAY:
            raise ValueError("not a path")
        if flags & ARRAY_EMBED:
            first = self.mem.word(v + 16)
        else:
            first = self.mem.word(self.mem.word(v + 32))
        return self.string(first)

    def lines(self, body: int):
        """pos -> line of the iseq at `body` (iseq.c's
        get_insn_info_succinct_bitvector), or None without a table."""
        f = self.f
        head = self.mem.read(body, f["body_succ_index_table"] + 8)
        iseq_size = struct.unpack_from("<I", head, f["body_iseq_size"])[0]
        info, = struct.unpack_from("<Q", head, f["body_insns_info"])
        count, = struct.unpack_from("<I", head, f["body_insns_info_size"])
        table, = struct.unpack_from("<Q", head, f["body_succ_index_table"])
        size = f["insn_info_entry_size"]
        if not info or not count or count > MAX_POSITIONS or iseq_size > MAX_POSITIONS:
            return None
        entries = self.mem.read(info, count * size)
        line_of = [struct.unpack_from("<i", entries, i * size)[0] for i in range(count)]
        if count == 1:
            return lambda pos: line_of[0]
        if not table:
            return None
        imm = struct.unpack("<6Q", self.mem.read(table, 8 * IMMEDIATE_PART_WORDS))
        nblocks = max(0, (iseq_size - IMMEDIATE_TABLE_SIZE + 511) // 512)
        raw = self.mem.read(table + 8 * IMMEDIATE_PART_WORDS, nblocks * SUCC_BLOCK.size) \
            if nblocks else b""
        blocks = [SUCC_BLOCK.unpack_from(raw, i * SUCC_BLOCK.size) for i in range(nblocks)]

        def rank(x: int) -> int:
            if x < IMMEDIATE_TABLE_SIZE:
                return (imm[x // 9] >> ((x % 9) * 7)) & 0x7F
            block = blocks[(x - IMMEDIATE_TABLE_SIZE) // 512]
            bit = (x - IMMEDIATE_TABLE_SIZE) % 512
            small = bit // 64
            small_rank = 0 if small == 0 else (block[1] >> ((small - 1) * 9)) & 0x1FF
            word = (block[2 + small] << (63 - bit % 64)) & ((1 << 64) - 1)
            return block[0] + small_rank + bin(word).count("1")

        def line(pos: int) -> int:
            if pos >= iseq_size:
                return 0
            try:
                at = rank(pos) - 1
            except IndexError:
                return 0
            return line_of[at] if 0 <= at < count else 0
        return line
