"""Decode the records of a perf ring buffer into model events.

Every event ustack opens uses the same leading sample fields
(IDENTIFIER | TID | TIME | CPU | CALLCHAIN), so one fixed struct reads the
head of any sample and the IDENTIFIER tells which probe it came from.
Uprobe events may add STACK_USER (a few words at sp, to recover the return
address at a function entry) or REGS_USER + STACK_USER (DWARF unwinding)."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Optional

from ..model import (CommEvent, ForkEvent, Mapping,
                     MmapEvent, Sample)
from . import perf_event as pe

RECORD_LOST, RECORD_COMM = 2, 3
RECORD_THROTTLE, RECORD_FORK, RECORD_SAMPLE = 5, 7, 9
RECORD_MMAP2, RECORD_LOST_SAMPLES = 10, 13
MISC_COMM_EXEC = 1 << 13
PROT_EXEC = 4

BASE_SAMPLE_TYPE = (pe.SAMPLE_IDENTIFIER | pe.SAMPLE_TID | pe.SAMPLE_TIME
                    | pe.SAMPLE_CPU | pe.SAMPLE_CALLCHAIN)

_HEADER = struct.Struct("<IHH")
# identifier, pid, tid, time, cpu, reserved, callchain nr
_SAMPLE_HEAD = struct.Struct("<QIIQIIQ")
_SAMPLE_HEAD_END = 8 + _SAMPLE_HEAD.size
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_MMAP2 = struct.Struct("<IIQQQIIQQII")
_PID_TID = struct.Struct("<II")
_FORK = struct.Struct("<IIII")
_LOST = struct.Struct("<QQ")
_CONTEXT_MARKER = 0xFFFFFFFFFFFFF000    # PERF_CONTEXT_* values are above this
_IPS_CACHE: dict = {}


def _ips_struct(n: int) -> struct.Struct:
    s = _IPS_CACHE.get(n)
    if s is None:
        s = _IPS_CACHE[n] = struct.Struct(f"<{n}Q")
    return s


@dataclass(frozen=True)
class EventLayout:
    """What the reader must know about one opened event (by its id)."""
    label: str
    stack_size: int = 0                 # STACK_USER bytes requested (0 = none)
    regs_mask: int = 0                  # REGS_USER mask (0 = none)
    return_address_slot: Optional[int] = None
    args: Optional[object] = None       # trace_format.ArgsDecoder: RAW fetch-args


_REG_NAMES: dict = {}


def _reg_names(mask: int) -> tuple:
    """The REGS_USER register names a mask selects, in the kernel's order."""
    names = _REG_NAMES.get(mask)
    if names is None:
        names = _REG_NAMES[mask] = tuple(r for i, r in enumerate(pe.X86_REGS)
                                         if mask >> i & 1)
    return names


def _cstring(buf: bytes, start: int, end: int) -> str:
    nul = buf.find(b"\0", start, end)
    return buf[start:nul if nul >= 0 else end].decode("utf-8", "replace")


class RecordReader:
    def __init__(self, layouts: dict):
        self.layouts = layouts          # event id -> EventLayout
        self.lost = 0
        self.throttled = 0

    # -- metadata records -------------------------------------------------
    def _meta(self, typ: int, misc: int, chunk: bytes, off: int, size: int):
        body = off + 8
        if typ == RECORD_MMAP2:
            (pid, tid, addr, length, pgoff, _maj, _min, _ino, _gen, prot,
             _flags) = _MMAP2.unpack_from(chunk, body)
            if not prot & PROT_EXEC:
                return None
            path = _cstring(chunk, body + _MMAP2.size, off + size)
            return MmapEvent(pid, tid, Mapping(addr, addr + length, pgoff, path))
        if typ == RECORD_COMM:
            pid, tid = _PID_TID.unpack_from(chunk, body)
            comm = _cstring(chunk, body + 8, off + size)
            return CommEvent(pid, tid, comm, bool(misc & MISC_COMM_EXEC))
        if typ == RECORD_FORK:
            return ForkEvent(*_FORK.unpack_from(chunk, body))
        # losses are totals for the end of the run, not events to apply
        if typ == RECORD_LOST:
            self.lost += _LOST.unpack_from(chunk, body)[1]
        elif typ == RECORD_LOST_SAMPLES:
            self.lost += _U64.unpack_from(chunk, body)[0]
        elif typ == RECORD_THROTTLE:
            self.throttled += 1         # samples dropped with no count
        return None

    # -- samples ------------------------------------------------------------
    def _user_stack(self, chunk: bytes, pos: int, layout: EventLayout):
        """Returns (regs dict or None, stack bytes or None)."""
        regs = None
        if layout.regs_mask:
            abi = _U64.unpack_from(chunk, pos)[0]
            pos += 8
            if abi:
                names = _reg_names(layout.regs_mask)
                regs = dict(zip(names, _ips_struct(len(names)).unpack_from(chunk, pos)))
                pos += 8 * len(names)
        stack = None
        if layout.stack_size:
            size = _U64.unpack_from(chunk, pos)[0]
            pos += 8
            if size:
                dyn = _U64.unpack_from(chunk, pos + size)[0]
                stack = memoryview(chunk)[pos:pos + dyn]    # no copy
        return regs, stack

    def raw_samples(self, chunk: bytes, on_meta: Callable, out: list,
                    start: int = 0, budget: int = 1 << 62) -> int:
        """Append samples to `out` without decoding their stacks, as tuples
        (ident, pid, tid, time, cpu, chain_bytes, extra), where `extra` is
        the REGS_USER/STACK_USER part; metadata goes to on_meta(time, event).
        Callers key caches and counts on the raw bytes and decode each
        unique stack once (`decode`): the fast path for trace and count.
        Stops after about `budget` bytes; returns the offset reached."""
        off, n = start, len(chunk)
        stop_at = min(n, start + budget)
        layouts = self.layouts
        head = _SAMPLE_HEAD.unpack_from
        header = _HEADER.unpack_from
        append = out.append
        while off < stop_at:
            typ, misc, size = header(chunk, off)
            if size == 0:
                return n                # corrupt; never loop forever
            if typ == RECORD_SAMPLE:
                if size < _SAMPLE_HEAD_END:
                    off += size             # no callchain: not one of our layouts
                    continue
                ident, pid, tid, t, cpu, _r, nr = head(chunk, off + 8)
                pos = off + _SAMPLE_HEAD_END
                end = pos + 8 * nr
                layout = layouts.get(ident)
                if layout is None:          # not ours (a flush event)
                    off += size
                    continue
                # REGS_USER / STACK_USER as the kernel wrote them, if any
                extra = (chunk[end:off + size]
                         if layout.stack_size or layout.regs_mask or layout.args
                         else b"")
                append((ident, pid, tid, t, cpu, chunk[pos:end], extra))
            else:
                event = self._meta(typ, misc, chunk, off, size)
                if event is not None:
                    # sample_id_all trailer: pid/tid, TIME, cpu, identifier
                    on_meta(_U64.unpack_from(chunk, off + size - 24)[0], event)
            off += size
        return off

    def label(self, ident: int) -> str:
        layout = self.layouts.get(ident)
        return layout.label if layout else "?"

    def decode(self, ident: int, pid: int, tid: int, chain: bytes,
               extra: bytes) -> Sample:
        """The Sample of one raw_samples() tuple, for unwinding (its time and
        CPU stay with the caller)."""
        raw = _ips_struct(len(chain) // 8).unpack_from(chain)
        layout = self.layouts.get(ident) or EventLayout("?")
        regs = stack = None
        if extra:
            # RAW (u32 size + record, 8-byte aligned) comes before the regs
            pos = 4 + _U32.unpack_from(extra, 0)[0] if layout.args else 0
            regs, stack = self._user_stack(extra, pos, layout)
        return Sample(layout.label, 0, pid, tid, -1,
                      tuple(ip for ip in raw if ip < _CONTEXT_MARKER),
                      stack, regs, layout.return_address_slot)

    def entry_word(self, ident: int, extra) -> bytes:
        """All a frame-pointer sample's stack depends on besides its
        callchain: the return-address word at its entry slot (b"" for
        none). Keys of caches and counts use it instead of `extra`, whose
        fetch-arg values and stack copy vary from call to call."""
        layout = self.layouts.get(ident)
        if layout is None or layout.return_address_slot is None or not extra:
            return b""
        pos = 4 + _U32.unpack_from(extra, 0)[0] if layout.args else 0
        size = _U64.unpack_from(extra, pos)[0]          # STACK_USER size
        at = 8 * layout.return_address_slot
        if not size or _U64.unpack_from(extra, pos + 8 + size)[0] < at + 8:
            return b""                                  # not copied (dyn_size)
        return bytes(extra[pos + 8 + at:pos + 16 + at])

    def fp_sample(self, ident: int, pid: int, tid: int, chain: bytes,
                  word: bytes) -> Sample:
        """The Sample of a callchain and its entry_word(), for the
        frame-pointer unwinder."""
        raw = _ips_struct(len(chain) // 8).unpack_from(chain)
        layout = self.layouts.get(ident) or EventLayout("?")
        return Sample(layout.label, 0, pid, tid, -1,
                      tuple(ip for ip in raw if ip < _CONTEXT_MARKER),
                      word or None, None, 0 if word else None)

    def args_text(self, ident: int, extra) -> str:
        """' name=value …' of a sample's fetch-args ('' for none)."""
        layout = self.layouts.get(ident)
        if layout is None or layout.args is None or len(extra) < 4:
            return ""
        size = _U32.unpack_from(extra, 0)[0]
        return layout.args.text(memoryview(extra)[4:4 + size])

    def is_dwarf(self, ident: int) -> bool:
        layout = self.layouts.get(ident)
        return layout is not None and bool(layout.regs_mask)
