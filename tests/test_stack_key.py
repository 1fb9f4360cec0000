"""session.Run keys frame-pointer stacks on what they depend on: the
callchain and the return-address word at an entry uprobe's slot, never the
fetch-arg values or the rest of the record, so a probe with fetch-args
still formats each distinct stack once (trace) and counts one entry per
stack (count). Records are built as each reader receives them."""
from __future__ import annotations

import io
import struct

from ustack.capture.tracefs import TracefsReader, _Layout
from ustack.kernel.perf_records import EventLayout, RecordReader
from ustack.kernel.trace_format import ArgsDecoder, Field
from ustack.model import Frame
from ustack.session import Options, Run

IDENT = 7
CHAIN = struct.pack("<3Q", 0x401010, 0x402020, 0x403030)
RET = 0x401555                       # the caller's return address at [sp]
FIELDS = {"n": Field("n", 8, 8, False, False, 1)}   # after the 8 common bytes


def _decoder():
    return ArgsDecoder(FIELDS, {"n": "dec"})


def _perf_extra(n: int, slot: int, sp_words: tuple) -> bytes:
    """RAW (u32 size, record, padded to 8) then STACK_USER (u64 size,
    the words, u64 dyn_size), as PERF_SAMPLE_RAW | STACK_USER write them."""
    record = struct.pack("<HBBiQ", IDENT, 0, 0, 1234, n)
    raw = struct.pack("<I", 20) + record + bytes(4)
    copy = struct.pack(f"<{slot + 1}Q", *sp_words)
    return raw + struct.pack("<Q", len(copy)) + copy + struct.pack("<Q", len(copy))


def _tracefs_record(n: int) -> bytes:
    """A uprobe record with the user's `n` and the reserved `ra` word."""
    return struct.pack("<HBBiQQ", IDENT, 0, 0, 1234, n, RET)


class _Symbolizer:
    def __init__(self):
        self.calls = 0

    def frames(self, pid, addrs):
        self.calls += 1
        return tuple(Frame(addr=a, module="m", function=f"f{a:x}") for a in addrs)


def _perf_reader(slot=1):
    return RecordReader({IDENT: EventLayout("uprobe:m:d", 8 * (slot + 1), 0,
                                            slot, _decoder())})


def _tracefs_reader():
    layout = _Layout("uprobe:m:d")
    layout.args, layout.ra, layout.keep = _decoder(), 16, True
    return TracefsReader({IDENT: layout}, -1)


def _events(reader):
    if isinstance(reader, RecordReader):
        # the word below the return address changes too: not part of the key
        return [(n, _perf_extra(n, 1, (0x1000 + n, RET))) for n in range(5)]
    return [(n, _tracefs_record(n)) for n in range(5)]


def _run(mode):
    return Run(Options(mode=mode), io.StringIO(), io.StringIO())


def test_entry_word_is_the_return_address_only():
    for reader in (_perf_reader(), _tracefs_reader()):
        words = {reader.entry_word(IDENT, extra) for _n, extra in _events(reader)}
        assert words == {struct.pack("<Q", RET)}
        assert reader.entry_word(IDENT, b"") == b""
        sample = reader.fp_sample(IDENT, 1, 2, CHAIN, struct.pack("<Q", RET))
        assert (sample.stack, sample.return_address_slot) == (struct.pack("<Q", RET), 0)


def test_perf_entry_word_not_copied():
    """dyn_size shorter than the slot (the stack ended): no word."""
    extra = bytearray(_perf_extra(3, 1, (1, RET)))
    extra[-8:] = struct.pack("<Q", 8)
    assert _perf_reader().entry_word(IDENT, bytes(extra)) == b""


def test_count_one_entry_per_stack_whatever_the_args():
    for reader in (_perf_reader(), _tracefs_reader()):
        run = _run("count")
        on_raw = run._counter(reader)
        for n, extra in _events(reader):
            on_raw(IDENT, 1, 2, n, 0, CHAIN, extra)
        assert list(run.counts.values()) == [5]
        (key,) = run.counts
        addrs, _notes = run._unwound(reader, IDENT, 1, 2, key[4:],
                                     lambda pid, addr: object())
        # the entry word is the caller, inserted after the probed ip
        assert addrs == (0x401010, RET, 0x402020, 0x403030)


def test_trace_formats_each_stack_once_and_prints_every_value():
    for reader in (_perf_reader(), _tracefs_reader()):
        run = _run("trace")
        run.tracker.comm = lambda pid, tid: "prog"
        run.tracker.find = lambda pid, addr: object()
        symbolizer = _Symbolizer()
        on_raw = run._tracer(reader, symbolizer)
        for n, extra in _events(reader):
            on_raw(IDENT, 1, 2, n, 0, CHAIN, extra)
        assert symbolizer.calls == 1
        text = "".join(run.pending)
        assert [line.split(": ", 1)[1] for line in text.splitlines()
                if line.startswith("prog ")] == [f"uprobe:m:d n={n}" for n in range(5)]
        assert text.count(f"f{RET:x}") == 5
