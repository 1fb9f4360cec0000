"""`trace -f json`: JSON Lines, one object per event, as it happens:

    {"time": 3767.424342,            # seconds, CLOCK_MONOTONIC (perf's clock)
     "time_ns": 3767424342123,
     "pid": 4242, "tid": 4242, "cpu": 1, "comm": "chain",
     "event": "uprobe:/tmp/chain:d",
     "args": {"n": 42, "s": "text"},  # uprobe fetch-args: strings as text
                                      # (bytes that are not UTF-8 as \\xNN),
                                      # arrays as lists, null for a value
                                      # the record was too short to hold
     "frames": [FRAME, …],            # innermost first, FRAME as in json_stacks
     "notes": ["…"]}"""
from __future__ import annotations

import json
from io import TextIOBase

from ..model import RawSample, Stack
from .json_stacks import frame_dicts

MAX_CACHED = 100_000               # encoded stacks kept; bounds memory


def arg_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, tuple):
        return list(value)
    return value


class JsonEventsReport:
    """The events interface (see formats.py): add(), renamed(), flush()."""

    def __init__(self, out: TextIOBase, labels: list):
        self.out = out
        self.labels = labels
        self.pending: list = []
        self._stacks: dict = {}          # id(Stack) -> (Stack, '"frames":…' text)
        self._comms: dict = {}           # (pid, tid) -> comm

    def add(self, sample: RawSample, stack: Stack, comm_of) -> None:
        entry = self._stacks.get(id(stack))
        if entry is None or entry[0] is not stack:
            if len(self._stacks) > MAX_CACHED:
                self._stacks.clear()
            tail = json.dumps({"frames": frame_dicts(stack.frames),
                               "notes": list(stack.notes)})[1:]   # no opening brace
            entry = self._stacks[id(stack)] = (stack, tail)
        ids = (sample.pid, sample.tid)
        comm = self._comms.get(ids)
        if comm is None:
            comm = self._comms[ids] = comm_of(sample.pid, sample.tid, sample.time_ns)
        head = json.dumps({
            "time": sample.time_ns / 1e9, "time_ns": sample.time_ns,
            "pid": sample.pid, "tid": sample.tid, "cpu": sample.cpu, "comm": comm,
            "event": self.labels[sample.probe],
            "args": {name: arg_value(v) for name, _kind, v in sample.args}})
        self.pending.append(f"{head[:-1]}, {entry[1]}\n")

    def renamed(self) -> None:
        self._comms.clear()

    def flush(self) -> None:
        self.out.write("".join(self.pending))
        self.pending.clear()
