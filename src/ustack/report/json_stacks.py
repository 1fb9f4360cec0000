"""`-f json` of count and profile (`.json`): the counted stacks as plain
JSON, for scripts.

    {"format": "ustack-stacks", "version": 1,
     "command": "count" | "profile" | …,
     "events": ["uprobe:/tmp/chain:d", …],
     "frequency": 49 | null,          # profile: samples per second
     "unit": "count" | "nanoseconds" | "bytes" | "sum", # of "value" below
                                      # (memleak: bytes; count --weight: bytes
                                      # where it sums a byte count, else sum)
     "weight": "count" | null,        # count --weight: the argument summed
     "stacks": [                      # most frequent first
       {"event": "uprobe:/tmp/chain:d", "comm": "chain", "pid": 4242,
        "count": 100,                 # events (or samples) with this stack;
                                      # offcpu: nanoseconds, as value;
                                      # --weight: the sum, as value
        "value": 100,                 # count, or count × 1e9/frequency ns
        "frames": [FRAME, …],         # innermost first
        "notes": ["…"]}]}             # what stopped the unwinder, if anything

    FRAME = {"function": "d" | null,  # null: no symbol
             "module": "chain",       # basename of the object, "" if none
             "path": "/tmp/chain",    # the object as the process saw it
             "offset": 0,             # address - function start
             "address": "0x55d0…",    # runtime address, hex (> 2**53)
             "file": "chain.c" | null, "line": 36 | null,   # with --lines
             "inlined": false,        # a call inlined into the next frame
             "kernel": false,         # a kernel frame (--kernel)
             "kind": null,            # "python", "php", "perl", "ruby", "js", "java": an interpreter's
                                      # or a JIT's frame (python: address 0)
             "object_address": "0x11f6" | null,  # unnamed: the pc in its object (ELF)
             "code_start": "0x11e0" | null}      # unnamed: its code's start by the CFI

Stacks of the same event, process and frames are one entry whatever the
thread; ties in count keep a fixed order (event, pid, comm, names)."""
from __future__ import annotations

import json
from io import TextIOBase

from ..model import StackCount
from .pprof_objects import split_kernel
from .formats import weight_of
from .text import is_timed

FORMAT_NAME = "ustack-stacks"
FORMAT_VERSION = 1


def frame_dict(f, kernel: bool = False) -> dict:
    return {"function": f.function, "module": f.module, "path": f.path,
            "offset": f.offset, "address": f"0x{f.addr:x}",
            "file": f.file or None, "line": f.line or None,
            "inlined": f.inlined, "kernel": kernel, "kind": f.kind or None,
            "object_address": f"0x{f.objaddr:x}" if f.objaddr else None,
            "code_start": f"0x{f.objstart:x}" if f.objstart else None}


def frame_dicts(frames) -> list:
    """Frames as FRAMEs, the kernel's (before the separator) marked."""
    kernel, user = split_kernel(frames)
    return [frame_dict(f, True) for f in kernel] + [frame_dict(f) for f in user]


class JsonReport:
    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        # entries are per process and keep addresses: per_pid/offsets change nothing
        self.context = context
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: TextIOBase) -> None:
        """The document with one stack a line: greppable, small."""
        doc = self.document()
        stacks = doc.pop("stacks")
        out.write(json.dumps(doc)[:-1] + ', "stacks": [')
        out.write(",".join(f"\n {json.dumps(s)}" for s in stacks))
        out.write("\n]}\n")

    def document(self) -> dict:
        context = self.context
        command = getattr(context, "command", "count")
        frequency = getattr(context, "frequency", None) if command == "profile" else None
        ns = 1_000_000_000 // frequency if frequency else 0
        if is_timed(context):
            ns = 1                        # the counts are nanoseconds already
        merged: dict = {}
        for sc in self.counted:
            key = (sc.event, sc.pid, sc.comm, sc.stack)
            merged[key] = merged.get(key, 0) + sc.count
        order = sorted(merged.items(), key=lambda kv: (
            -kv[1], kv[0][0], kv[0][1], kv[0][2],
            tuple(f.function or "" for f in kv[0][3].frames)))
        events = (tuple(getattr(context, "events", ()))
                  or tuple(dict.fromkeys(sc.event for sc in self.counted)))
        weight = weight_of(context)
        unit = "nanoseconds" if ns else getattr(context, "value_unit", None) or "count"
        if weight is not None:
            unit = weight.unit or "sum"
        return {
            "format": FORMAT_NAME, "version": FORMAT_VERSION,
            "command": command, "events": list(events), "frequency": frequency,
            "unit": unit, "weight": weight.expr if weight is not None else None,
            "stacks": [{"event": event, "comm": comm, "pid": pid, "count": n,
                        "value": n * ns if ns else n,
                        "frames": frame_dicts(stack.frames),
                        "notes": list(stack.notes)}
                       for (event, pid, comm, stack), n in order]}
