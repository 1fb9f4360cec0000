"""A uprobe's fetch-args fetched by ustack's own BPF program (trace
--backend bpf, capture/bpf_unwind.py), so a trace with arguments keeps the
in-kernel unwinder: `compile_args(probe)` turns the kernel's fetch-args
(probes/fetchargs.py: `%di`, `+8(%si):u32`, `+0(%dx):string`, `$stack2`,
`$retval`, `$comm`, `@0x1000`, `\\5`, …) into BPF that writes their values
into the event's record, and `decode` gives the (name, kind, value) triples
trace_format.ArgsDecoder gives the perf path, so every report prints the
same whichever backend ran.

Values as the kernel's uprobe fetch gives them (kernel/trace/trace_probe_tmpl.h,
trace_uprobe.c), measured through the perf path on Linux 6.18:
- a register, `$stack` (sp), `$retval` (ax at a uretprobe), `\\IMM`: the
  value, cut to the type's size; `$stackN`: the word at sp + 8N, 0 where it
  cannot be read; `@ADDR`, `@+OFFSET` (a file offset of the probed
  binary, placed from the probe's address): the memory there;
- `+OFF(X)`: memory at X + OFF (8 bytes when another dereference follows,
  the type's size last); a read that faults gives 0;
- strings (`string`, `ustring`, `$comm`): at most 4095 bytes each
  (MAX_STRING_SIZE), a longer one as ""; all of an event's strings share
  one page with the fixed-size fields (the uprobe's per-CPU buffer), in
  order: the one that overflows it is cut, those after it are ""; a
  string that cannot be read is "" (the perf path prints "", as
  ArgsDecoder decodes an empty __data_loc).
BPF reads user memory without faulting pages in, where the kernel's uprobe
fetch faults them in: a string or value in a page the process has not
touched yet (a literal or constant at its first use) fails to read here.
The program then records where that page maps a file (bpf_find_vma:
device, inode, offset) and decode() reads it from the file, which is what
the page would have held (never written, or it would be present); in
anonymous memory such a page holds zeros: "" or 0, as the kernel gives.
Where this still differs: such a read in a file ustack has not loaded
(not an object with code), an array's or a pointer's on the way to the
value, or a string in an event whose strings the kernel cuts (over the
page), gives "" or 0; a dereference that faults on the way to a string
gives "", where the kernel's record points at the next string's bytes (or
stale ones).

Record layout (after the frames of a streamed record, after the stack of
a deferred one): a fixed part of slots in argument order (a scalar's value
in 8 bytes, an array's elements end to end, a string's STRING_SLOT), then
the strings' bytes one after the other."""
from __future__ import annotations

import re
import struct

from ..kernel import bpf_syscall
from ..kernel.bpf_syscall import (ADD, JEQ, JGT, JLE, JNE, JSGE, LSH, SUB, Asm, alu_imm,
                                  alu_reg, call, ld_map_fd, jmp_imm, jmp_reg, ld_func,
                                  ld_imm64, ldx, mov, mov_imm, st_imm, stx)
from ..model import UstackError
from ..probes.fetchargs import parse_fetch_args, probe_kinds
from ..values import replace, value
from .bpf_common import ARGS_AREA

MAX_STRING = 4096            # the kernel's MAX_STRING_SIZE, the NUL included
PAGE_ROOM = 4096             # a uprobe's fetched fields: one page (MAX_UCB_BUFFER_SIZE)
STRING_READ = MAX_STRING + 1  # one byte more tells a too-long string
MAX_ARRAY = 64               # the kernel's MAX_ARRAY_LEN

# r10 offsets of the emitted code's locals: below the unwinder's (-64 up);
# -88 is ARGS_SAVED
USED = -72                   # string bytes written so far
TOTAL = -80                  # the strings' bytes, as the first pass measured them
TMP = -96                    # a word read on the way
ADDR = -104                  # an address kept across a helper call
COMM = -120                  # 16 bytes: the comm
VMA = -160                   # 40 bytes: bpf_unwind's "vma" callback's answer

_SCALAR = re.compile(r"([usx])(8|16|32|64)")
_BITFIELD = re.compile(r"b([0-9]+)@([0-9]+)/(8|16|32|64)")
_DEREF = re.compile(r"([+-])(u?)([^(]+)\((.*)\)")
# a string's slot: bytes stored (its NUL included), what the first pass read
# (< 0: a fault, STRING_READ: too long), and where a string BPF could not
# read is in its file: (kernel dev, inode, offset), inode 0 for none
STRING_SLOT = struct.Struct("<IiQQQ")
# a value read from memory: the value, and where it is in a file when BPF
# could not read it, as for a string
READ_SLOT = struct.Struct("<QQQQ")
_U64 = struct.Struct("<Q")
_STRUCTS: dict = {}          # FetchArgs.plain -> its struct.Struct


class CannotFetch(UstackError):
    """A fetch-arg the BPF program does not fetch (the perf path does)."""


@value
class Arg:
    """One fetch-arg as the program fetches it."""
    name: str
    kind: str                  # how it prints (probes.fetchargs.display_kinds)
    node: tuple                # the fetch, parsed (_parse)
    size: int = 8              # bytes of the value, or of one element
    signed: bool = False
    count: int = 0             # elements of an array, 0 for one value
    bits: tuple = ()           # a bitfield's (width, offset)
    string: bool = False
    slot: int = 0              # its offset in the fixed part

    @property
    def slot_size(self) -> int:
        if self.string:
            return STRING_SLOT.size
        if self.read:
            return READ_SLOT.size
        return (self.size * self.count + 7) & ~7 if self.count else 8

    @property
    def read(self) -> bool:
        """Whether it is one value read from memory (READ_SLOT)."""
        return self.node[0] == "deref" and not self.count and not self.string

    @property
    def kernel_size(self) -> int:
        """Its field's bytes in the kernel's record (a string's __data_loc: 4)."""
        return 4 if self.string else self.size * (self.count or 1)


@value
class FetchArgs:
    """The compiled fetch-args of one probe."""
    args: tuple
    fixed: int                 # bytes of slots
    room: int                  # bytes for strings (0 without strings)
    file_base: int = 0         # -(file offset of the probe): @+OFFSET from ip
    # every arg a plain integer: the struct format of the slots, and
    # (name, kind) per arg, for decode's fast path ("" for none)
    plain: str = ""
    labels: tuple = ()

    @property
    def capacity(self) -> int:
        """Bytes the emitted code may write from its base: the slots, the
        strings' page, and the read of a string that starts at its end
        (the verifier checks the largest of each, not their sum)."""
        return self.fixed + (self.room + ((STRING_READ + 7) & ~7) if self.room else 0)

    # -- the program -------------------------------------------------------
    def emit(self, a: Asm, base: int, at: int, tag: str) -> None:
        """Code that writes the values at register `base` + `at` (r6 = the
        pt_regs ctx; base is one of r7-r9, kept; r0-r5 clobbered); the
        bytes written end at `at` + length() (see emit_length)."""
        if self.room:           # as the kernel: the strings' lengths, then their bytes
            a.emit(st_imm(10, TOTAL, 0))
            for i, arg in enumerate(self.args):
                if arg.string:
                    Emitter(a, base, at, f"{tag}n{i}_", self).string_length(arg)
            a.emit(st_imm(10, USED, 0))
        for i, arg in enumerate(self.args):
            Emitter(a, base, at, f"{tag}{i}_", self).arg(arg)

    def emit_length(self, a: Asm, reg: int) -> None:
        """reg += the bytes the emitted code wrote (clobbers r1)."""
        a.emit(alu_imm(ADD, reg, self.fixed))
        if self.room:
            a.emit(ldx(1, 10, USED), alu_reg(ADD, reg, 1))

    # -- the programs the unwinder's trace program goes on in -------------
    @staticmethod
    def contract(**fields) -> "TailContract":
        return TailContract(**fields)

    def tail_programs(self, contract: "TailContract", offsets) -> tuple:
        """((code, functions) of the stream program, of the deferred one):
        see tail_programs."""
        return tail_programs(self, contract, offsets)

    # -- the record --------------------------------------------------------
    def decode(self, buf, start: int, end: int, read_file=None) -> tuple:
        """(name, kind, value) per arg of the area buf[start:end], as
        trace_format.ArgsDecoder.decode gives them. `read_file(dev, inode,
        offset, size)`: bytes of a loaded object, for a string in a page
        the process had not touched (see recover)."""
        if self.plain:
            layout = _STRUCTS.get(self.plain) or _STRUCTS.setdefault(
                self.plain, struct.Struct(self.plain))
            if start + layout.size <= end:
                out = []
                for (name, kind), number in zip(self.labels, layout.unpack_from(buf, start)):
                    out.append((name, kind, number))
                return tuple(out)
        out = []
        strings = []                    # (index in out, its slot's fields)
        dyn = start + self.fixed
        for arg in self.args:
            at = start + arg.slot
            try:
                if at + arg.slot_size > end:
                    raise struct.error("short")
                if arg.string:
                    fields = STRING_SLOT.unpack_from(buf, at)
                    n = fields[0]
                    value = bytes(buf[dyn:min(dyn + n, end)]).split(b"\0", 1)[0]
                    dyn += n
                    strings.append((len(out), fields))
                elif arg.read:
                    raw, dev, ino, offset = READ_SLOT.unpack_from(buf, at)
                    if ino and read_file is not None:     # its page was not present
                        found = read_file(dev, ino, offset, arg.size)
                        if found is not None and len(found) == arg.size:
                            raw = int.from_bytes(found, "little")
                    value = _scalar(arg, raw)
                elif arg.count:
                    value = tuple(_scalar(arg, int.from_bytes(
                        buf[at + k * arg.size:at + (k + 1) * arg.size], "little"))
                        for k in range(arg.count))
                else:
                    value = _scalar(arg, _U64.unpack_from(buf, at)[0])
            except struct.error:
                value = None
            out.append((arg.name, arg.kind, value))
        if read_file is not None and any(f[4] for _i, f in strings):
            self.recover(out, strings, read_file)
        return tuple(out)

    def recover(self, out: list, strings: list, read_file) -> None:
        """The strings BPF could not read because their page was not
        present (the kernel's fetch faults it in): read from the file the
        page maps, where that gives what the kernel would have shown: it
        is in a file, and every string fits whole in the room as the kernel
        measures it (no string too long, none cut)."""
        total, found = 0, {}
        for i, (n, first, dev, ino, offset) in strings:
            if first == STRING_READ or (first > 0 and n != first):
                return                      # the kernel's cuts: not redone here
            if ino:
                raw = read_file(dev, ino, offset, MAX_STRING)
                if raw is None or b"\0" not in raw:
                    return
                found[i] = raw.split(b"\0", 1)[0]
                total += len(found[i]) + 1
            else:
                total += max(first, 0)
        if total <= self.room:
            for i, text in found.items():
                out[i] = (out[i][0], out[i][1], text)


def _scalar(arg: Arg, raw: int) -> int:
    bits = 8 * arg.size
    raw &= (1 << bits) - 1
    if arg.bits:
        width, offset = arg.bits
        return (raw >> offset) & ((1 << width) - 1)
    if arg.signed and arg.kind != "hex" and raw >> (bits - 1):
        raw -= 1 << bits
    return raw


class Emitter:
    """The code of one arg."""

    def __init__(self, a: Asm, base: int, at: int, tag: str, fetch: FetchArgs):
        self.a, self.base, self.at, self.tag, self.f = a, base, at, tag, fetch
        self.faults = False         # whether a read jumps to the fault label

    def arg(self, arg: Arg) -> None:
        a, slot = self.a, self.at + arg.slot
        if arg.string:
            self.string(arg)
            return
        if arg.node[0] == "deref":
            _op, off, inner = arg.node
            self.value(inner)
            self.add(1, off)
            a.emit(stx(10, ADDR, 1))
            for k in range(0, arg.slot_size, 8):
                a.emit(st_imm(self.base, slot + k, 0))
            for k in range(arg.count or 1):
                # a read that faults leaves zeros (the helper clears its dst)
                a.emit(mov(1, self.base), alu_imm(ADD, 1, slot + k * arg.size),
                       mov_imm(2, arg.size), ldx(3, 10, ADDR))
                self.add(3, k * arg.size)
                a.emit(call(bpf_syscall.PROBE_READ_USER))
            if arg.read:
                a.jump(jmp_imm, JEQ, 0, 0, to=f"{self.tag}read")
                self.where_in_file(slot, f"{self.tag}read")
                a.label(f"{self.tag}read")
        else:
            self.value(arg.node)
            a.emit(stx(self.base, slot, 1))
        self.end(arg)

    def end(self, arg: Arg) -> None:
        """Where a faulting dereference on the way leads: the slot zeroed
        (0, or a string of length 0)."""
        a, slot = self.a, self.at + arg.slot
        if self.faults:
            a.jump(bpf_syscall.ja, to=f"{self.tag}done")
            a.label(f"{self.tag}fault")
            for k in range(0, arg.slot_size, 8):
                a.emit(st_imm(self.base, slot + k, 0))
        a.label(f"{self.tag}done")

    def string_length(self, arg: Arg) -> None:
        """The kernel's first pass (__get_data_size): the string's length
        with its NUL, 0 if it faults or is longer than MAX_STRING, added to
        TOTAL (at most the room); what the read returned into its slot,
        and where in a file the string is when the read faulted."""
        a, t, slot = self.a, self.tag, self.at + arg.slot
        helper, most = self.address(arg)
        for k in range(0, STRING_SLOT.size, 8):
            a.emit(st_imm(self.base, slot + k, 0))
        a.emit(mov(1, self.base), alu_imm(ADD, 1, self.at + self.f.fixed),
               mov_imm(2, most), ldx(3, 10, ADDR), call(helper),
               stx(self.base, slot + 4, 0, size=4))
        a.jump(jmp_imm, JSGE, 0, 0, to=f"{t}read")
        if arg.node[0] != "comm":
            self.where_in_file(slot, f"{t}none")
        a.label(f"{t}none")
        a.emit(mov_imm(0, 0))
        a.label(f"{t}read")
        a.jump(jmp_imm, JNE, 0, STRING_READ, to=f"{t}fits")
        a.emit(mov_imm(0, 0))
        a.label(f"{t}fits")
        self.accumulate(TOTAL)
        self.end(arg)

    def string(self, arg: Arg) -> None:
        """The kernel's second pass (store_trace_args): the string's bytes
        after the earlier strings', at most what the first pass left for
        them (it cuts the one that overflows, gives "" after it)."""
        a, t, slot, room = self.a, self.tag, self.at + arg.slot, self.f.room
        helper, _most = self.address(arg)
        a.emit(ldx(2, 10, TOTAL), ldx(1, 10, USED), alu_reg(SUB, 2, 1))
        a.jump(jmp_imm, JSGE, 2, 0, to=f"{t}left")
        a.emit(mov_imm(2, 0))
        a.label(f"{t}left")
        a.jump(jmp_imm, JLE, 2, room, to=f"{t}sized")
        a.emit(mov_imm(2, room))
        a.label(f"{t}sized")
        if arg.node[0] == "comm":       # strscpy: all of it, or "" where it does not fit
            a.emit(ldx(1, self.base, slot + 4, size=4))
            a.jump(jmp_reg, JGT, 1, 2, to=f"{t}none")
        a.emit(mov(1, self.base), alu_imm(ADD, 1, self.at + self.f.fixed),
               ldx(4, 10, USED), alu_reg(ADD, 1, 4), ldx(3, 10, ADDR), call(helper))
        a.jump(jmp_imm, JSGE, 0, 0, to=f"{t}read")
        a.label(f"{t}none")
        a.emit(mov_imm(0, 0))                     # a fault: ""
        a.label(f"{t}read")
        a.emit(stx(self.base, slot, 0, size=4))
        self.accumulate(USED)
        self.end(arg)

    def where_in_file(self, slot: int, failed: str) -> None:
        """After a read of a string or a value faulted: where its page maps a file (the
        unwinder's "vma" callback: start, end, page offset, dev, inode)
        into the slot, for ustack to read it there (decode's read_file):
        BPF cannot fault a page in, the kernel's uprobe fetch does. Goes
        on at label `failed` where the page maps no file."""
        a = self.a
        for k in range(0, 40, 8):
            a.emit(st_imm(10, VMA + k, 0))
        a.emit(call(bpf_syscall.GET_CURRENT_TASK_BTF), mov(1, 0), ldx(2, 10, ADDR))
        a.jump(ld_func, 3, to="vma")
        a.emit(mov(4, 10), alu_imm(ADD, 4, VMA), mov_imm(5, 0), call(bpf_syscall.FIND_VMA))
        a.jump(jmp_imm, JNE, 0, 0, to=failed)
        a.emit(ldx(1, 10, VMA + 32))
        a.jump(jmp_imm, JEQ, 1, 0, to=failed)
        a.emit(stx(self.base, slot + 16, 1), ldx(1, 10, VMA + 24),
               stx(self.base, slot + 8, 1),
               # offset = address - start + page offset * 4096
               ldx(1, 10, ADDR), ldx(2, 10, VMA), alu_reg(SUB, 1, 2),
               ldx(2, 10, VMA + 16), alu_imm(LSH, 2, 12), alu_reg(ADD, 1, 2),
               stx(self.base, slot + 24, 1))

    def address(self, arg: Arg) -> tuple:
        """ADDR = where the string is; (the helper that reads it, its size)."""
        a = self.a
        if arg.node[0] == "comm":
            a.emit(mov(1, 10), alu_imm(ADD, 1, COMM), mov_imm(2, 16),
                   call(bpf_syscall.GET_CURRENT_COMM), mov(1, 10), alu_imm(ADD, 1, COMM),
                   stx(10, ADDR, 1))
            return bpf_syscall.PROBE_READ_KERNEL_STR, 16
        _op, off, inner = arg.node            # the string at inner + off
        self.value(inner)
        self.add(1, off)
        a.emit(stx(10, ADDR, 1))
        return bpf_syscall.PROBE_READ_USER_STR, STRING_READ

    def accumulate(self, at: int) -> None:
        """r10[at] = min(r10[at] + r0, room)."""
        a, t = self.a, self.tag
        a.emit(ldx(1, 10, at), alu_reg(ADD, 1, 0))
        a.jump(jmp_imm, JLE, 1, self.f.room, to=f"{t}sum")
        a.emit(mov_imm(1, self.f.room))
        a.label(f"{t}sum")
        a.emit(stx(10, at, 1))

    def value(self, node: tuple) -> None:
        """r1 = the value of `node` (r0-r5 clobbered); a dereference that
        faults jumps to the arg's fault label."""
        a, op = self.a, node[0]
        if op == "reg":
            a.emit(ldx(1, 6, bpf_syscall.PT_REGS[node[1]]))
        elif op == "imm":
            a.emit(ld_imm64(1, node[1]))
        elif op == "file":                        # @+OFFSET: ip - probe's offset + OFFSET
            a.emit(ldx(1, 6, bpf_syscall.PT_REGS["ip"]))
            self.add(1, self.f.file_base + node[1])
        elif op == "stack":                       # $stackN: 0 where unreadable
            a.emit(ldx(3, 6, bpf_syscall.PT_REGS["sp"]))
            self.add(3, 8 * node[1])
            self.read_word()
        elif op == "deref":
            _op, off, inner = node
            self.value(inner)
            a.emit(mov(3, 1))
            self.add(3, off)
            self.read_word()
            self.faults = True
            a.jump(jmp_imm, JNE, 0, 0, to=f"{self.tag}fault")
        else:
            raise AssertionError(node)

    def read_word(self) -> None:
        """r1 = the user word at r3 (0 if unreadable); r0 = the helper's result."""
        self.a.emit(mov(1, 10), alu_imm(ADD, 1, TMP), mov_imm(2, 8),
                    call(bpf_syscall.PROBE_READ_USER), ldx(1, 10, TMP))

    def add(self, reg: int, n: int) -> None:
        if n == 0:
            return
        if -(1 << 31) <= n < (1 << 31):
            self.a.emit(alu_imm(ADD, reg, n))
        else:
            self.a.emit(ld_imm64(5, n), alu_reg(ADD, reg, 5))


# --- the programs: where the in-kernel unwinder's trace program goes on -----------

TAIL_CALL = 12
ARGS_SAVED = -88             # 8 x frames, kept while the args are fetched
_EXACT_WORD = -8             # the map key of a lookup


@value
class TailContract:
    """What the trace program (src/ustack/bpf/unwind.bpf.c, unwind_trace)
    leaves for the fetch-args programs it tail-calls: its record's head in
    the per-CPU `scratch` value at `record_at` (frames count at
    `frames_count_at`), the frames at `frames_at`; a deferred record in the
    per-CPU `deferred` value, `deferred_size` bytes before the args. The
    programs output the record to `ring`, count a full ring in `errors` at
    `ring_full` (`undeferred` for a deferred one, which then goes on as
    the stream record through `fetch_args[stream_slot]`)."""
    scratch: object
    deferred: object
    ring: object
    errors: object
    fetch_args: object
    record_at: int
    record_size: int
    frames_count_at: int
    frames_at: int
    max_frames: int
    deferred_size: int
    ring_full: int
    undeferred: int
    stream_slot: int
    result: int


def tail_programs(fetch: FetchArgs, c: TailContract, offsets) -> tuple:
    """((code, functions) of the stream program, of the deferred one)."""
    return _stream_program(fetch, c, offsets), _deferred_program(fetch, c, offsets)


def _lookup0(a: Asm, m, dst: int) -> None:
    a.emit(st_imm(10, _EXACT_WORD, 0, size=4), ld_map_fd(1, m.fd), mov(2, 10),
           alu_imm(ADD, 2, _EXACT_WORD), call(bpf_syscall.FN_MAP_LOOKUP_ELEM), mov(dst, 0))


def _count(a: Asm, errors, slot: int) -> None:
    a.emit(st_imm(10, _EXACT_WORD, slot, size=4), ld_map_fd(1, errors.fd), mov(2, 10),
           alu_imm(ADD, 2, _EXACT_WORD), call(bpf_syscall.FN_MAP_LOOKUP_ELEM))
    a.jump(jmp_imm, JEQ, 0, 0, to="counted")
    a.emit(mov_imm(1, 1), bpf_syscall.atomic_add(0, 0, 1))
    a.label("counted")


def _stream_program(fetch: FetchArgs, c: TailContract, offsets) -> tuple:
    """The record in scratch, its fetch-args after its frames, out."""
    a = Asm()
    a.emit(mov(6, 1))
    _lookup0(a, c.scratch, 8)
    a.jump(jmp_imm, JEQ, 8, 0, to="out")
    a.emit(ldx(3, 8, c.frames_count_at, size=4))
    a.jump(jmp_imm, JLE, 3, c.max_frames, to="n")
    a.emit(mov_imm(3, c.max_frames))
    a.label("n")
    a.emit(alu_imm(LSH, 3, 3), stx(10, ARGS_SAVED, 3), mov(9, 8), alu_reg(ADD, 9, 3))
    fetch.emit(a, 9, c.frames_at, "fa")
    a.emit(ldx(3, 10, ARGS_SAVED))
    fetch.emit_length(a, 3)
    a.emit(alu_imm(ADD, 3, c.record_size), ld_map_fd(1, c.ring.fd), mov(2, 8),
           alu_imm(ADD, 2, c.record_at), mov_imm(4, 0), call(bpf_syscall.RINGBUF_OUTPUT))
    a.jump(jmp_imm, JEQ, 0, 0, to="out")
    _count(a, c.errors, c.ring_full)
    return _finish(a, fetch, c, offsets)


def _deferred_program(fetch: FetchArgs, c: TailContract, offsets) -> tuple:
    """The deferred record, its fetch-args after its stack, out; where
    the ring is full, the stream record (the stack as walked) instead."""
    a = Asm()
    a.emit(mov(6, 1))
    _lookup0(a, c.deferred, 9)
    a.jump(jmp_imm, JEQ, 9, 0, to="out")
    fetch.emit(a, 9, c.deferred_size, "dfa")
    a.emit(mov_imm(3, c.deferred_size))
    fetch.emit_length(a, 3)
    a.emit(ld_map_fd(1, c.ring.fd), mov(2, 9), mov_imm(4, 0), call(bpf_syscall.RINGBUF_OUTPUT))
    a.jump(jmp_imm, JEQ, 0, 0, to="out")
    _count(a, c.errors, c.undeferred)
    a.emit(mov(1, 6), ld_map_fd(2, c.fetch_args.fd), mov_imm(3, c.stream_slot),
           call(TAIL_CALL))
    return _finish(a, fetch, c, offsets)


def _finish(a: Asm, fetch: FetchArgs, c: TailContract, offsets) -> tuple:
    a.label("out")
    a.emit(mov_imm(0, c.result), bpf_syscall.exit_())
    if not any(f.read or (f.string and f.node[0] != "comm") for f in fetch.args):
        return a.assemble(), ()         # no where_in_file: no callback
    vma = len(a)
    a.label("vma")
    _vma_callback(a, offsets)
    return a.assemble(), (vma,)


def _vma_callback(a: Asm, o) -> None:
    """bpf_find_vma's callback (task, vma, ctx) for where_in_file:
    ctx[0..5] = vm_start, vm_end, vm_pgoff, dev, inode (0, 0 for memory
    without a file; the vDSO's is (0, 1)), as unwind.h's vma_found."""
    a.emit(ldx(1, 2, o.vm_start), stx(3, 0, 1), ldx(1, 2, o.vm_end), stx(3, 8, 1),
           ldx(1, 2, o.vm_pgoff), stx(3, 16, 1), ldx(1, 2, o.vm_file))
    a.jump(jmp_imm, JNE, 1, 0, to="v_file")
    a.emit(ldx(4, 2, o.vm_mm))
    a.jump(jmp_imm, JEQ, 4, 0, to="v_out")
    a.emit(ldx(4, 4, o.mm_vdso), ldx(5, 3, 0))
    a.jump(jmp_reg, JNE, 4, 5, to="v_out")
    a.emit(st_imm(3, 32, 1))
    a.jump(bpf_syscall.ja, to="v_out")
    a.label("v_file")
    a.emit(ldx(1, 1, o.f_inode))
    a.jump(jmp_imm, JEQ, 1, 0, to="v_out")
    a.emit(ldx(4, 1, o.i_ino), stx(3, 32, 4), ldx(1, 1, o.i_sb))
    a.jump(jmp_imm, JEQ, 1, 0, to="v_out")
    a.emit(ldx(1, 1, o.s_dev, size=4), stx(3, 24, 1))
    a.label("v_out")
    a.emit(mov_imm(0, 0), bpf_syscall.exit_())


# --- compiling -------------------------------------------------------------------

def compile_args(probe) -> FetchArgs:
    """The probe's fetch-args as the program fetches them, or CannotFetch
    saying which one it cannot and why."""
    kinds = probe_kinds(probe)
    ret = probe.spec.kind == "uretprobe"
    triples = parse_fetch_args(list(probe.fetch_args), probe.spec.kind, probe.label)
    args, slot = [], 0
    for word, (name, fetch, typ) in zip(probe.fetch_args, triples):
        try:
            arg = _arg(name, fetch, typ, kinds.get(name, "hex"), ret)
        except CannotFetch as e:
            raise CannotFetch(f"{word} ({e})") from None
        args.append(replace(arg, slot=slot))
        slot += arg.slot_size
    strings = any(a.string for a in args)
    room = PAGE_ROOM - sum(a.kernel_size for a in args) if strings else 0
    plain = [_plain(a) for a in args]
    fetch = FetchArgs(tuple(args), slot, max(room, 0), -probe.file_offset,
                      "" if None in plain else "<" + "".join(plain),
                      tuple((a.name, a.kind) for a in args))
    if fetch.capacity > ARGS_AREA:
        raise CannotFetch(f"{' '.join(probe.fetch_args)} (more than {ARGS_AREA} bytes "
                          "of values per event)")
    return fetch


_PLAIN = {1: ("B", "7x"), 2: ("H", "6x"), 4: ("I", "4x"), 8: ("Q", "")}


def _plain(arg: Arg) -> str | None:
    """The struct format of a plain integer's 8-byte slot, else None (a
    value read from memory has a READ_SLOT, with where its page is)."""
    if arg.string or arg.count or arg.bits or arg.read:
        return None
    code, pad = _PLAIN[arg.size]
    return (code.lower() if arg.signed and arg.kind != "hex" else code) + pad


def why_not(probes: list) -> str | None:
    """None when the program fetches every fetch-arg of `probes`, else
    which it cannot and why."""
    for probe in probes:
        if getattr(probe, "fetch_args", ()):
            try:
                compile_args(probe)
            except CannotFetch as e:
                return str(e)
    return None


def _arg(name: str, fetch: str, typ: str, kind: str, ret: bool) -> Arg:
    node = _parse(fetch, ret)
    base, _, count = typ.partition("[")
    n = 0
    if count:
        n = int(count.rstrip("]"))
        if base in ("string", "ustring"):
            raise CannotFetch("arrays of strings are fetched by the perf backend only")
        if node[0] != "deref":
            raise CannotFetch("an array is read from memory: it needs a dereference")
        if not 1 <= n <= MAX_ARRAY:
            raise CannotFetch(f"arrays have 1…{MAX_ARRAY} elements")
    if base in ("string", "ustring") or node[0] == "comm":
        if base not in ("", "string", "ustring"):
            raise CannotFetch(f"$comm is a string, not {base}")
        if node[0] not in ("deref", "comm"):
            raise CannotFetch("a string is read from memory: it needs a dereference")
        return Arg(name, kind, node, string=True)
    m = _SCALAR.fullmatch(base or "x64")
    if m:
        return Arg(name, kind, node, int(m.group(2)) // 8, m.group(1) == "s", n)
    if base == "char":
        return Arg(name, kind, node, 1, False, n)
    m = _BITFIELD.fullmatch(base)
    if m and not count:
        width, offset, size = map(int, m.groups())
        if width + offset > size or not width:
            raise CannotFetch(f"bitfield {base} does not fit its {size}-bit container")
        return Arg(name, kind, node, size // 8, bits=(width, offset))
    raise CannotFetch(f"BPF does not fetch the type {typ}")


def _parse(fetch: str, ret: bool) -> tuple:
    """A fetch as a tree: ('reg', name), ('imm', n), ('stack', n),
    ('file', offset), ('comm',), ('deref', offset, inner)."""
    if fetch.startswith("%"):
        reg = fetch[1:]
        if reg not in bpf_syscall.PT_REGS:
            raise CannotFetch(f"no register {fetch} in pt_regs")
        return ("reg", reg)
    if fetch == "$retval":
        return ("reg", "ax")
    if fetch == "$comm":
        return ("comm",)
    if fetch == "$stack":
        return ("reg", "sp")
    if fetch.startswith("$stack") and fetch[6:].isdigit():
        return ("stack", int(fetch[6:]))
    if fetch.startswith("\\"):
        if fetch[1:2] == '"':
            raise CannotFetch("immediate strings are fetched by the perf backend only")
        return ("imm", _number(fetch[1:], fetch))
    if fetch.startswith("@+"):
        if ret:
            raise CannotFetch("at a uretprobe the function's address, which @+OFFSET "
                              "counts from, is not known")
        return ("deref", 0, ("file", _number(fetch[2:], fetch)))
    if fetch.startswith("@"):
        if not fetch[1:2].isdigit():
            raise CannotFetch("uprobes take no symbols in @")
        return ("deref", 0, ("imm", _number(fetch[1:], fetch)))
    m = _DEREF.fullmatch(fetch)
    if m:
        inner = _parse(m.group(4), ret)
        if inner[0] == "comm":
            raise CannotFetch("$comm cannot be dereferenced")
        off = _number(m.group(3), fetch)
        return ("deref", -off if m.group(1) == "-" else off, inner)
    raise CannotFetch(f"BPF does not fetch {fetch}")


def _number(text: str, fetch: str) -> int:
    """An integer as the kernel's kstrto*l(…, 0) reads it: 0x hex, 0 octal."""
    neg = text.startswith("-")
    digits = text.lstrip("+-")
    try:
        if digits[:2].lower() == "0x":
            n = int(digits[2:], 16)
        elif digits.startswith("0") and len(digits) > 1:
            n = int(digits[1:], 8)
        else:
            n = int(digits, 10)
    except ValueError:
        raise CannotFetch(f"'{text}' in {fetch} is not a number") from None
    return -n if neg else n
