"""`trace`: a perf-script-like header per event, then its frames (text.py's
format). Formatting is cached: the frame lines once per distinct Stack the
resolver hands out, the header's text around the timestamp once per thread,
CPU and probe, so a hot event costs a few dict lookups and a string join."""
from __future__ import annotations

from io import TextIOBase

from ..model import RawSample, Stack
from .fetchargs import format_args
from .text import format_stack, header_parts

MAX_CACHED = 100_000               # formatted stacks kept; bounds memory


class TraceReport:
    def __init__(self, out: TextIOBase, labels: list):
        self.out = out
        self.labels = labels             # probe index -> event name
        self.pending: list = []          # text waiting to be written
        self._blocks: dict = {}          # id(Stack) -> (Stack, frame lines)
        self._heads: dict = {}           # (tid, cpu, probe) -> header parts
        self.ns_of = None                # id -> its id in its own pid namespace

    def add(self, sample: RawSample, stack: Stack, comm_of) -> None:
        """One event; `comm_of(pid, tid, time_ns)` names its thread, asked only when
        the header of that thread, CPU and probe is not cached."""
        entry = self._blocks.get(id(stack))
        if entry is None or entry[0] is not stack:
            if len(self._blocks) > MAX_CACHED:
                self._blocks.clear()
            entry = self._blocks[id(stack)] = (stack, format_stack(stack))
        hkey = (sample.tid, sample.cpu, sample.probe)
        head = self._heads.get(hkey)
        if head is None:
            ns = ((self.ns_of(sample.pid), self.ns_of(sample.tid))
                  if self.ns_of is not None else ())
            head = self._heads[hkey] = header_parts(
                comm_of(sample.pid, sample.tid, sample.time_ns), sample.pid, sample.tid,
                sample.cpu, self.labels[sample.probe], ns)
        t = sample.time_ns               # format_time's text, without its call
        if sample.args:                  # fetch-args: ' a=1 …' after the name
            self.pending.append(f"{head[0]}{t // 1_000_000_000}.{t % 1_000_000_000 // 1000:06d}"
                                f"{head[1][:-1]}{format_args(sample.args)}\n{entry[1]}")
        else:
            self.pending.append(f"{head[0]}{t // 1_000_000_000}.{t % 1_000_000_000 // 1000:06d}"
                                f"{head[1]}{entry[1]}")

    def add_all(self, samples: list, stacks: list, comm_of) -> None:
        """add() of each sample with its Stack: a piece's events in one
        loop, add()'s work inline (this is the trace's per-event cost)."""
        blocks, heads, pending = self._blocks, self._heads, self.pending.append
        for sample, stack in zip(samples, stacks):
            entry = blocks.get(id(stack))
            head = heads.get((sample.tid, sample.cpu, sample.probe))
            if head is None or entry is None or entry[0] is not stack or sample.args:
                self.add(sample, stack, comm_of)
                continue
            t = sample.time_ns
            pending(f"{head[0]}{t // 1_000_000_000}.{t % 1_000_000_000 // 1000:06d}"
                    f"{head[1]}{entry[1]}")

    def renamed(self) -> None:
        """A thread changed its name (or exec'd): headers are made anew."""
        self._heads.clear()

    def flush(self) -> None:
        self.out.write("".join(self.pending))
        self.pending.clear()
