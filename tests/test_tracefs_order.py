"""The tracefs backend reads each CPU's ftrace buffer in turn, so one pass
can find a fork child's first samples on one CPU and miss the fork record
its parent wrote on a CPU read a moment before. Records are decoded in
time order up to the time a pass over every buffer began (a horizon): the
child's samples wait for the fork that gives them its parent's maps.
The records are laid out by this kernel's own formats for
sched_process_fork and ftrace's user_stack. And a child's pre-exec
samples decoded once it has exec'd are not given the maps /proc shows
then, its new program's."""
from __future__ import annotations

import os
import struct
import subprocess

import pytest

from ustack.capture.tracefs_maps import ProcessWatch
from ustack.kernel import procfs, tracefs
from ustack.kernel.ftrace_records import (CPU_PREFIX, EventLayout, TracefsRecords,
                                          horizon_chunk)
from ustack.kernel.trace_format import event_id, parse_format
from ustack.model import MmapEvent, RawSample

pytestmark = pytest.mark.kernel

PARENT, CHILD = 4100, 4101
PROBE_ID = 60000                    # a uprobe event's id (not one of the kernel's)
CHAIN = (0x401010, 0x401020, 0x401030)


class Watch:
    """Stands for the capture's ProcessWatch: what it is told, in order."""

    def __init__(self):
        self.seen = []

    def fork(self, t, parent_tid, child, metas):
        self.seen.append(("fork", child, t))

    def exec(self, t, pid, filename, metas):
        self.seen.append(("exec", pid, t))

    def sample(self, sample, metas):
        self.seen.append(("sample", sample.pid, sample.time_ns))


@pytest.fixture(scope="module")
def formats():
    return {name: tracefs.event_format(group, name) for group, name in
            [("sched", "sched_process_fork"), ("sched", "sched_process_exec"),
             ("ftrace", "user_stack")]}


def _record(fmt: str, values: dict, tail: bytes = b"") -> bytes:
    """A record of the event `fmt` describes, its fields set from `values`."""
    fields = parse_format(fmt)
    size = max(f.offset + f.size for f in fields.values())
    body = bytearray(size)
    struct.pack_into("<H", body, 0, event_id(fmt))
    for name, value in values.items():
        f = fields[name]
        struct.pack_into({4: "<I", 8: "<Q"}[f.size] if f.count == 1 else f"<{f.count}Q",
                         body, f.offset, *(value if f.count > 1 else (value,)))
    return bytes(body) + tail


def _fork(formats) -> bytes:
    names = b"sh\0sh\0"                 # the comms, after the fixed fields
    end = max(f.offset + f.size for f in parse_format(formats["sched_process_fork"]).values())
    return _record(formats["sched_process_fork"], {
        "common_pid": PARENT, "parent_pid": PARENT, "child_pid": CHILD,
        "parent_comm": 3 << 16 | end, "child_comm": 3 << 16 | (end + 3)}, names)


def _user_stack(formats, tgid: int) -> bytes:
    return _record(formats["user_stack"], {
        "common_pid": tgid, "tgid": tgid, "caller": CHAIN + (0,) * (8 - len(CHAIN))})


def _probe_hit() -> bytes:
    return struct.pack("<HBBiQ", PROBE_ID, 0, 0, CHILD, 0)


def _page(cpu: int, stamped: list) -> bytes:
    """A trace_pipe_raw page of CPU `cpu`: (time, record) in time order."""
    data = b""
    now = base = stamped[0][0]
    for t, rec in stamped:
        rec += bytes(-len(rec) % 4)
        data += struct.pack("<I", (len(rec) // 4) | (t - now) << 5) + rec
        now = t
    return CPU_PREFIX.pack(cpu) + struct.pack("<QQ", base, len(data)) + data


def _records(formats, watch: Watch) -> TracefsRecords:
    records = TracefsRecords({PROBE_ID: EventLayout(0)})
    records.set_user_stack(formats["user_stack"])
    records.follow_processes(watch, formats["sched_process_fork"],
                             formats["sched_process_exec"])
    records.ordered = True              # as the capture sets it: wait for horizons
    return records


def _read(records: TracefsRecords, chunks: list) -> list:
    samples: list = []
    for chunk in chunks:
        records.read(chunk, [], samples)
    return samples


def test_a_child_sample_read_before_its_fork_waits_for_it(formats):
    """A pass begins at 1000: CPU 0 holds nothing yet, then the parent
    forks there (1100) and the child hits the probe on CPU 1 (1200),
    which the pass reads. The next pass, begun at 1300, reads the fork."""
    watch = Watch()
    records = _records(formats, watch)
    hit = _page(1, [(1200, _probe_hit()), (1201, _user_stack(formats, CHILD))])
    fork = _page(0, [(1100, _fork(formats)), (1101, _user_stack(formats, PARENT))])
    assert _read(records, [hit, horizon_chunk(1000)]) == []
    assert watch.seen == []
    samples = _read(records, [fork, horizon_chunk(1300)])
    assert watch.seen == [("fork", CHILD, 1100), ("sample", CHILD, 1200)]
    assert [(s.pid, s.time_ns) for s in samples] == [(CHILD, 1200)]


def test_the_end_of_a_run_decodes_every_record_in_time_order(formats):
    """The run's last records go out at its end, whichever CPU read first."""
    watch = Watch()
    records = _records(formats, watch)
    hit = _page(1, [(1200, _probe_hit()), (1201, _user_stack(formats, CHILD))])
    fork = _page(0, [(1100, _fork(formats)), (1101, _user_stack(formats, PARENT))])
    samples = _read(records, [hit, fork, b""])
    assert watch.seen == [("fork", CHILD, 1100), ("sample", CHILD, 1200)]
    assert [s.callchain for s in samples] == [struct.pack("<3Q", *CHAIN)]


def _fp_sample(pid: int, t: int, addrs) -> RawSample:
    chain = struct.pack(f"<{len(addrs)}Q", *addrs)
    return RawSample(0, pid, pid, t, 0, chain, b"", None, None, ())


def test_maps_read_after_an_exec_are_not_sent_for_the_program_before_it():
    """`cat` is forked from this process and has exec'd: a sample taken
    in the copy of this program it ran before (decoded before its exec)
    finds none of its addresses in cat's maps, and sends none of them;
    once the exec is decoded, its samples get cat's maps, after it."""
    ours = [m for m in procfs.executable_mappings(os.getpid()) if m.path]
    before = ours[0].start + 16            # an address of this program's text
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdin.write(b"up\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"up\n"     # cat runs: exec'd and loaded
        theirs = procfs.executable_mappings(child.pid)
        after = next(m for m in theirs if m.path.endswith("/cat")).start + 16
        assert not any(m.start <= before < m.end for m in theirs)
        watch, metas = ProcessWatch(), []
        watch.sample(_fp_sample(child.pid, 100, [before]), metas)
        assert metas == []
        watch.exec(200, child.pid, "/usr/bin/cat", metas)
        watch.sample(_fp_sample(child.pid, 300, [after]), metas)
        sent = [(t, e.mapping.path) for t, e in metas if isinstance(e, MmapEvent)]
        assert sent and all(t == 300 for t, _ in sent), metas
        assert any(path.endswith("/cat") for _, path in sent), metas
    finally:
        child.kill()
        child.communicate()
