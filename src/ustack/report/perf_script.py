"""`trace -f perf-script`: each event as `perf script` prints a sample with
its callchain (perf 6.1, fields comm,pid,tid,cpu,time,period,event,ip,sym,
symoff,dso), so what reads perf script text reads ustack's trace:
FlameGraph's stackcollapse-perf.pl, speedscope's and the Firefox
Profiler's perf importers.

    chain  4242/4242  [001]  3767.424342:          1 uprobe:/tmp/chain:d: 
    \t    55d0c3a1a169 d+0x0 (/tmp/chain)
    \t    55d0c3a1a221 c+0x2a (/tmp/chain)
    \t    7f3e5a62724a __libc_start_call_main+0x7a (/usr/lib/x86_64-linux-gnu/libc.so.6)
    (a blank line)

The period is 1 (one event); fetch-args follow the event name as perf puts
a tracepoint's fields. An unnamed frame is `[unknown]`, a frame outside
any file `([unknown])`, kernel frames (--kernel) `([kernel.kallsyms])`
before the user frames, an inlined call `name (inlined)` as perf writes
it, a Python frame `0 func (file.py:LINE)`. A frame's address is, as perf prints it, the address inside its
object (what addr2line -e OBJECT takes) when the object's load bias is
known (pprof_objects.py), else the process's. Unwinder notes are left out
(they are not perf's); the time is CLOCK_MONOTONIC, perf's clock."""
from __future__ import annotations

from io import TextIOBase

from ..model import SCRIPT_KINDS, Frame, RawSample, Stack
from .fetchargs import format_args
from .pprof_objects import ObjectFacts, split_kernel

MAX_CACHED = 100_000               # formatted stacks kept; bounds memory
KERNEL_DSO = "[kernel.kallsyms]"


def perf_frame_line(f: Frame, addr: int, kernel: bool = False) -> str:
    """`\\t{addr:16x} sym+0xoff (dso)`: one callchain line of perf script."""
    if f.inlined and f.function:
        return f"\t{addr:16x} {f.function} (inlined)\n"
    if f.kind in SCRIPT_KINDS:           # no object: its source file and line
        return f"\t{addr:16x} {f.function} ({f.file or '[unknown]'}:{f.line})\n"
    sym = f"{f.function}+0x{f.offset:x}" if f.function else "[unknown]"
    dso = KERNEL_DSO if kernel else (f.path or "[unknown]")
    return f"\t{addr:16x} {sym} ({dso})\n"


def perf_frame_lines(stack: Stack, pid: int, objects: ObjectFacts) -> str:
    """The callchain lines of a stack of process pid and the blank line
    that ends it."""
    kernel, user = split_kernel(stack.frames)
    for f in user:                       # any named frame tells its object's bias
        if f.path:
            objects.learn(pid, f)
    out = [perf_frame_line(f, f.addr, kernel=True) for f in kernel]
    for f in user:
        inside = objects.object_address(pid, f) if f.path else None
        out.append(perf_frame_line(f, f.addr if inside is None else inside))
    out.append("\n")
    return "".join(out)


def perf_header(comm: str, pid: int, tid: int, cpu: int, time_ns: int,
                event: str, args=()) -> str:
    """`comm  pid/tid  [cpu]  secs.usecs:          1 event: ` and a newline."""
    secs, ns = divmod(time_ns, 1_000_000_000)
    fields = format_args(args).lstrip()
    return (f"{comm} {pid:5d}/{tid:<5d} [{cpu:03d}] {secs:5d}.{ns // 1000:06d}: "
            f"{1:10d} {event}: {fields}\n")


class PerfScriptReport:
    """The events interface (see formats.py): add(), renamed(), flush()."""

    def __init__(self, out: TextIOBase, labels: list):
        self.out = out
        self.labels = labels             # probe index -> event name
        self.pending: list = []
        self._blocks: dict = {}          # id(Stack) -> (Stack, frame lines)
        self._comms: dict = {}           # (pid, tid) -> comm
        self._objects = ObjectFacts()

    def add(self, sample: RawSample, stack: Stack, comm_of) -> None:
        entry = self._blocks.get(id(stack))
        if entry is None or entry[0] is not stack:
            if len(self._blocks) > MAX_CACHED:
                self._blocks.clear()
            entry = self._blocks[id(stack)] = (stack, perf_frame_lines(
                stack, sample.pid, self._objects))
        ids = (sample.pid, sample.tid)
        comm = self._comms.get(ids)
        if comm is None:
            comm = self._comms[ids] = comm_of(sample.pid, sample.tid, sample.time_ns)
        self.pending.append(perf_header(comm, sample.pid, sample.tid, sample.cpu,
                                        sample.time_ns, self.labels[sample.probe],
                                        sample.args))
        self.pending.append(entry[1])

    def renamed(self) -> None:
        """A thread changed its name (or exec'd): names are asked anew."""
        self._comms.clear()

    def flush(self) -> None:
        self.out.write("".join(self.pending))
        self.pending.clear()
