"""Decode the records of a perf ring buffer into model events.

Every event ustack opens uses the same leading sample fields
(IDENTIFIER | TID | TIME | CPU | CALLCHAIN), so one fixed struct reads the
head of any sample and the IDENTIFIER tells which probe it came from.
Uprobe events may add STACK_USER (a few words at sp, to recover the return
address at a function entry) or REGS_USER + STACK_USER (DWARF unwinding)."""
from __future__ import annotations

import struct

from ..model import (CommEvent, ExitEvent, ForkEvent, Mapping, MmapEvent,
                     RawSample)
from . import perf_event as pe
from ..values import value

RECORD_LOST, RECORD_COMM, RECORD_EXIT = 2, 3, 4
RECORD_THROTTLE, RECORD_FORK, RECORD_SAMPLE = 5, 7, 9
RECORD_MMAP2, RECORD_LOST_SAMPLES = 10, 13
MISC_COMM_EXEC = 1 << 13
MISC_MMAP_BUILD_ID = 1 << 14       # MMAP2: build-id in place of maj/min/ino
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
_MMAP2_BUILD_ID = struct.Struct("<IIQQQB3x20sII")
_PID_TID = struct.Struct("<II")
_FORK = struct.Struct("<IIII")
_LOST = struct.Struct("<QQ")
_IPS_CACHE: dict = {}


def _ips_struct(n: int) -> struct.Struct:
    s = _IPS_CACHE.get(n)
    if s is None:
        s = _IPS_CACHE[n] = struct.Struct(f"<{n}Q")
    return s


@value
class EventLayout:
    """What the reader must know about one opened event (by its id)."""
    probe: int                          # index of the probe in the run's list
    stack_size: int = 0                 # STACK_USER bytes requested (0 = none)
    regs_mask: int = 0                  # REGS_USER mask (0 = none)
    # STACK_USER holds just the word at sp + 8 * slot: see RawSample
    return_address_slot: int | None = None
    args: object | None = None       # trace_format.ArgsDecoder: RAW fetch-args


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


_GENERAL = object()                     # not a fast path: see RecordReader._sample


def _fast_slot(layout: EventLayout):
    """How read() decodes an event's samples: None for a callchain alone,
    the return-address slot for a callchain + that word, else _GENERAL."""
    if layout.regs_mask or layout.args is not None:
        return _GENERAL
    if not layout.stack_size:
        return None
    slot = layout.return_address_slot
    return slot if slot is not None else _GENERAL


def count_samples(chunk: bytes, start: int = 0) -> int:
    """How many sample records a chunk holds from `start`, decoding none
    (what a run asked to end drops unread)."""
    n, off, end = 0, start, len(chunk)
    header = _HEADER.unpack_from
    while off < end:
        typ, _misc, size = header(chunk, off)
        if size == 0:
            break
        n += typ == RECORD_SAMPLE
        off += size
    return n


# what `moments` yields
SAMPLED, PROCESS_GONE, MAPPED = 1, 2, 3


def moments(chunk, ids) -> list:
    """What a chunk says happened to which thread, in order, decoding
    little: (SAMPLED, pid, tid, time) for a sample of an event in `ids`,
    (PROCESS_GONE, pid, pid, 0) at an exec or a process's exit, (MAPPED,
    pid, tid, 0) for an executable mapping. For what must be done while
    the sampled process still runs, before the records are decoded."""
    out = []
    off, end = 0, len(chunk)
    header, head = _HEADER.unpack_from, _SAMPLE_HEAD.unpack_from
    while off < end:
        typ, misc, size = header(chunk, off)
        if size == 0:
            break
        if typ == RECORD_SAMPLE:
            if size >= _SAMPLE_HEAD_END:
                ident, pid, tid, t = head(chunk, off + 8)[:4]
                if ident in ids:
                    out.append((SAMPLED, pid, tid, t))
        elif typ == RECORD_MMAP2:
            pid, tid = _PID_TID.unpack_from(chunk, off + 8)
            if _MMAP2.unpack_from(chunk, off + 8)[9] & PROT_EXEC:
                out.append((MAPPED, pid, tid, 0))
        elif typ == RECORD_COMM and misc & MISC_COMM_EXEC:
            pid = _PID_TID.unpack_from(chunk, off + 8)[0]
            out.append((PROCESS_GONE, pid, pid, 0))
        elif typ == RECORD_EXIT:
            pid, _ppid, tid, _ptid = _FORK.unpack_from(chunk, off + 8)
            if pid == tid:
                out.append((PROCESS_GONE, pid, pid, 0))
        off += size
    return out


class RecordReader:
    """Turns ring-buffer bytes into RawSamples and metadata events, and
    keeps the loss totals the kernel reports on the way."""

    def __init__(self, layouts: dict):
        self.layouts = layouts          # event id -> EventLayout
        self.lost = 0
        self.throttled = 0
        self._slots: dict = {}          # event id -> (_fast_slot(), probe)

    # -- metadata records -------------------------------------------------
    def _meta(self, typ: int, misc: int, chunk: bytes, off: int, size: int):
        body = off + 8
        if typ == RECORD_MMAP2:
            (pid, tid, addr, length, pgoff, _maj, _min, _ino, _gen, prot,
             _flags) = _MMAP2.unpack_from(chunk, body)
            if not prot & PROT_EXEC:
                return None
            path = _cstring(chunk, body + _MMAP2.size, off + size)
            build_id = ""
            if misc & MISC_MMAP_BUILD_ID:
                n, raw = _MMAP2_BUILD_ID.unpack_from(chunk, body)[5:7]
                build_id = raw[:min(n, 20)].hex()
            return MmapEvent(pid, tid, Mapping(addr, addr + length, pgoff, path,
                                               build_id=build_id))
        if typ == RECORD_COMM:
            pid, tid = _PID_TID.unpack_from(chunk, body)
            comm = _cstring(chunk, body + 8, off + size)
            # sample_id_all trailer: pid/tid, TIME, cpu, identifier
            return CommEvent(pid, tid, comm, bool(misc & MISC_COMM_EXEC),
                             _U64.unpack_from(chunk, off + size - 24)[0])
        if typ == RECORD_FORK:
            return ForkEvent(*_FORK.unpack_from(chunk, body))
        if typ == RECORD_EXIT:
            return ExitEvent(*_FORK.unpack_from(chunk, body))
        # losses are totals for the end of the run, not events to apply
        if typ == RECORD_LOST:
            self.lost += _LOST.unpack_from(chunk, body)[1]
        elif typ == RECORD_LOST_SAMPLES:
            self.lost += _U64.unpack_from(chunk, body)[0]
        elif typ == RECORD_THROTTLE:
            self.throttled += 1         # samples dropped with no count
        return None

    # -- samples ------------------------------------------------------------
    def _sample(self, chunk, pos: int, layout: EventLayout, pid: int, tid: int,
                t: int, cpu: int, chain: bytes) -> RawSample:
        """The RawSample of a record whose fixed head and callchain are
        decoded; at pos follow RAW, REGS_USER, STACK_USER, those the layout
        asked for, in that order."""
        args = ()
        if layout.args is not None:     # u32 size + the record, 8-aligned
            size = _U32.unpack_from(chunk, pos)[0]
            args = layout.args.decode(memoryview(chunk)[pos + 4:pos + 4 + size])
            pos += 4 + size
        regs = None
        if layout.regs_mask:
            abi = _U64.unpack_from(chunk, pos)[0]
            pos += 8
            if abi:
                names = _reg_names(layout.regs_mask)
                regs = dict(zip(names, _ips_struct(len(names)).unpack_from(chunk, pos)))
                pos += 8 * len(names)
        stack = None
        ret = b""
        if layout.stack_size:
            size = _U64.unpack_from(chunk, pos)[0]
            pos += 8
            if size:
                dyn = _U64.unpack_from(chunk, pos + size)[0]
                slot = layout.return_address_slot
                if slot is None:
                    stack = memoryview(chunk)[pos:pos + dyn]    # no copy
                elif dyn >= 8 * slot + 8:
                    ret = bytes(chunk[pos + 8 * slot:pos + 8 * slot + 8])
        return RawSample(layout.probe, pid, tid, t, cpu, chain, ret,
                         regs, stack, args)

    def read(self, chunk: bytes, metas: list, samples: list,
             start: int = 0, budget: int = 1 << 62) -> int:
        """Decode records from `start` for about `budget` bytes: samples go
        to `samples` (RawSample), metadata to `metas` as (time, event).
        Returns the offset reached."""
        off, n = start, len(chunk)
        stop_at = min(n, start + budget)
        layouts = self.layouts
        head = _SAMPLE_HEAD.unpack_from
        header = _HEADER.unpack_from
        u64 = _U64.unpack_from
        append = samples.append
        make = tuple.__new__              # RawSample without its Python __new__
        slots = self._slots
        while off < stop_at:
            typ, misc, size = header(chunk, off)
            if size == 0:
                return n                # corrupt; never loop forever
            if typ == RECORD_SAMPLE:
                if size < _SAMPLE_HEAD_END:
                    off += size             # no callchain: not one of our layouts
                    continue
                ident, pid, tid, t, cpu, _r, nr = head(chunk, off + 8)
                fast = slots.get(ident)
                if fast is None:
                    layout = layouts.get(ident)
                    if layout is None:      # not ours (a flush event)
                        off += size
                        continue
                    fast = slots[ident] = (_fast_slot(layout), layout.probe)
                slot, probe = fast
                pos = off + _SAMPLE_HEAD_END
                end = pos + 8 * nr
                # a user callchain starts with the PERF_CONTEXT_USER marker
                # (0xffff…fe00: its top byte, last in little-endian, is 0xff)
                if end > pos and chunk[pos + 7] == 0xFF:
                    pos += 8
                if slot is None:            # callchain only
                    append(make(RawSample, (probe, pid, tid, t,
                                            cpu, chunk[pos:end], b"", None, None, (),
                                            b"")))
                elif slot is _GENERAL:
                    append(self._sample(chunk, end, layouts[ident], pid, tid, t,
                                        cpu, chunk[pos:end]))
                else:                       # callchain + the word at the slot
                    # STACK_USER: u64 size, size bytes (the slot's word last),
                    # u64 dyn_size; just the u64 size when nothing was copied
                    ret = b""
                    at = end + 8 + 8 * slot
                    if off + size > end + 8 and u64(chunk, at + 8)[0] >= 8 * slot + 8:
                        ret = chunk[at:at + 8]
                    append(make(RawSample, (probe, pid, tid, t,
                                            cpu, chunk[pos:end], ret, None, None, (),
                                            b"")))
            else:
                event = self._meta(typ, misc, chunk, off, size)
                if event is not None:
                    # sample_id_all trailer: pid/tid, TIME, cpu, identifier
                    metas.append((u64(chunk, off + size - 24)[0], event))
            off += size
        return off
