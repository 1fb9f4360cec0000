"""Frame-pointer stacks are keyed on what they depend on: the callchain and
the return address read at an entry uprobe's slot, never the fetch-arg
values or the rest of the record. So a probe with fetch-args still
symbolizes and formats each distinct stack once (trace) and counts one
entry per stack (count). Records are built as each capture receives them
(perf ring-buffer records, ftrace ring-buffer pages) and decoded through
the public readers into RawSamples."""
from __future__ import annotations

import io
import struct

from ustack.kernel.ftrace_records import CPU_PREFIX, EventLayout as FtraceLayout
from ustack.kernel.ftrace_records import TracefsRecords
from ustack.kernel.perf_records import EventLayout, RecordReader
from ustack.kernel.trace_format import ArgsDecoder, Field
from ustack.model import Mapping, MmapEvent
from ustack.report.trace import TraceReport
from ustack.symbols.stacks import StackResolver
from ustack.target.mappings import MappingTracker

IDENT = 7                            # perf event id / ftrace event type
USER_STACK = 12                      # ftrace user_stack event type
PID, TID = 1234, 1235
CHAIN = (0x401010, 0x402020, 0x403030)
RET = 0x401555                       # the caller's return address at [sp]
FIELDS = {"n": Field("n", 8, 8, False, False, 1)}   # after the 8 common bytes
PERF_CONTEXT_USER = 0xFFFFFFFFFFFFFE00


def _decoder():
    return ArgsDecoder(FIELDS, {"n": "dec"})


def _perf_record(n: int, slot: int, sp_words: tuple, dyn: int = -1) -> bytes:
    """A PERF_RECORD_SAMPLE: IDENTIFIER|TID|TIME|CPU|CALLCHAIN, then RAW
    (u32 size, the tracepoint record, padded to 8), then STACK_USER (u64
    size, the words, u64 dyn_size)."""
    chain = (PERF_CONTEXT_USER,) + CHAIN
    body = struct.pack("<QIIQII", IDENT, PID, TID, 1000 + n, 0, 0)
    body += struct.pack(f"<Q{len(chain)}Q", len(chain), *chain)
    record = struct.pack("<HBBiQ", IDENT, 0, 0, TID, n)
    body += struct.pack("<I", 20) + record + bytes(4)
    copy = struct.pack(f"<{slot + 1}Q", *sp_words)
    body += struct.pack("<Q", len(copy)) + copy
    body += struct.pack("<Q", len(copy) if dyn < 0 else dyn)
    return struct.pack("<IHH", 9, 0, 8 + len(body)) + body


def _perf_samples(slot: int = 1) -> list:
    reader = RecordReader({IDENT: EventLayout(0, 8 * (slot + 1), 0, slot, _decoder())})
    # the word below the return address changes too: not part of the key
    chunk = b"".join(_perf_record(n, slot, (0x1000 + n, RET)) for n in range(5))
    samples: list = []
    assert reader.read(chunk, [], samples) == len(chunk)
    return samples


def _ftrace_entry(record: bytes) -> bytes:
    """A ring-buffer event: type_len = length / 4 (records up to 112 bytes)."""
    record += bytes(-len(record) % 4)
    return struct.pack("<I", len(record) // 4) + record


def _tracefs_samples() -> list:
    layout = FtraceLayout(0)
    layout.args, layout.return_address, layout.keep = _decoder(), 16, True
    records = TracefsRecords({IDENT: layout})
    records.user_stack_id = USER_STACK
    data = b""
    for n in range(5):
        data += _ftrace_entry(struct.pack("<HBBiQQ", IDENT, 0, 0, TID, n, RET))
        callers = struct.pack(f"<{len(CHAIN)}Q", *CHAIN) + bytes(8 * 5)
        data += _ftrace_entry(struct.pack("<HBBiII", USER_STACK, 0, 0, TID, PID, 0)
                              + callers)
    page = CPU_PREFIX.pack(0) + struct.pack("<QQ", 0, len(data)) + data
    samples: list = []
    records.read(page, [], samples)
    return samples


def _both():
    return {"perf": _perf_samples(), "tracefs": _tracefs_samples()}


def _resolver():
    tracker = MappingTracker()
    tracker.apply(MmapEvent(PID, PID, Mapping(0x400000, 0x500000, 0, "/nonexistent/m")))
    return StackResolver(tracker)


def test_samples_carry_the_return_address_and_args():
    for backend, samples in _both().items():
        assert len(samples) == 5, backend
        for n, s in enumerate(samples):
            assert (s.pid, s.tid, s.probe) == (PID, TID, 0), backend
            assert s.return_address == struct.pack("<Q", RET), backend
            assert s.args == (("n", "dec", n),), backend
            assert struct.unpack(f"<{len(CHAIN)}Q", s.callchain) == CHAIN, backend


def test_perf_return_address_not_copied():
    """dyn_size shorter than the slot (the stack ended): no return address."""
    reader = RecordReader({IDENT: EventLayout(0, 16, 0, 1, _decoder())})
    samples: list = []
    reader.read(_perf_record(3, 1, (1, RET), dyn=8), [], samples)
    assert samples[0].return_address == b""


def test_one_key_per_stack_whatever_the_args():
    for backend, samples in _both().items():
        resolver = _resolver()
        keys = {resolver.key(s) for s in samples}
        assert len(keys) == 1, backend
        stacks = {id(resolver.stack(s)) for s in samples}
        assert len(stacks) == 1, backend          # symbolized once
        # the return address is the caller, inserted after the probed ip
        assert [f.addr for f in resolver.stack(samples[0]).frames] == \
            [CHAIN[0], RET, CHAIN[1], CHAIN[2]], backend


def test_trace_prints_every_value_of_one_stack():
    for backend, samples in _both().items():
        resolver = _resolver()
        out = io.StringIO()
        report = TraceReport(out, ["uprobe:m:d"])
        for s in samples:
            report.add(s, resolver.stack(s), lambda pid, tid, time_ns: "prog")
        report.flush()
        text = out.getvalue()
        assert [line.split(": ", 1)[1] for line in text.splitlines()
                if line.startswith("prog ")] == [f"uprobe:m:d n={n}" for n in range(5)], backend
        assert text.count(f" 0x{RET:016x} : [unknown] [m]") == 5, backend
