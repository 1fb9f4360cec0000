"""`-f speedscope` (`.speedscope.json`): speedscope's file format
(https://www.speedscope.app/file-format-schema.json), opened by dropping
the file on speedscope's page or `speedscope FILE`.

One "sampled" profile per event, or per event and process with -P; each
distinct stack is a sample (frame indices, outermost first) weighted by
its count, or by its time in nanoseconds for a `profile` run, or by the
sum of its argument for `count --weight EXPR` (the profile's name then
ends `(bytes (count))` or `(sum of EXPR)`). Frames are
shared: name (the function; `[unknown] [module]` when unnamed; an inlined
call is marked `(inlined)`), file (the source file with --lines, else the
object's path) and line. Without -P a profile holding several commands
roots each stack at its command's name, as folded stacks do; kernel
frames (--kernel) come first, below the user frames, as in the stack.
An unwinder's note is a `[note]` frame at the root side, where the frames
it could not find would be, as in the flame graphs."""
from __future__ import annotations

import json
from io import TextIOBase

from ..model import StackCount, unnamed_function
from .pprof_objects import split_kernel
from .formats import weight_of
from .text import is_timed

SCHEMA = "https://www.speedscope.app/file-format-schema.json"


def frame_record(f) -> dict:
    """A frame as speedscope's Frame object."""
    if f.function:
        name = f"{f.function} (inlined)" if f.inlined else f.function
    else:
        name = f"{unnamed_function(f) or '[unknown]'} [{f.module}]" if f.module else "[unknown]"
    record = {"name": name}
    if f.file or f.path:
        record["file"] = f.file or f.path
    if f.line:
        record["line"] = f.line
    return record


class SpeedscopeReport:
    """Counted stacks as one speedscope JSON document."""

    def __init__(self, per_pid: bool = False, offsets: bool = False, context=None):
        self.per_pid = per_pid            # offsets: frames are functions here
        self.context = context
        self.counted: list = []

    def add(self, counted: StackCount) -> None:
        self.counted.append(counted)

    def finish(self, out: TextIOBase) -> None:
        json.dump(self.document(), out, separators=(",", ":"))
        out.write("\n")

    def document(self) -> dict:
        frames: dict = {}                 # frame record as a tuple -> index
        profiles: dict = {}               # profile key -> {stack indices -> weight}
        comms: dict = {}                  # profile key -> commands seen
        ns_per_sample = self._ns_per_sample()

        def index(record: dict) -> int:
            key = tuple(record.items())
            return frames.setdefault(key, len(frames))

        for sc in self.counted:
            key = (sc.event, sc.pid, sc.comm) if self.per_pid else (sc.event,)
            kernel, user = split_kernel(sc.stack.frames)
            notes = [index({"name": f"[{note}]"}) for note in sc.stack.notes]
            stack = tuple(notes + [index(frame_record(f)) for f in reversed(kernel + user)])
            samples = profiles.setdefault(key, {})
            comm_key = (sc.comm, stack)
            samples[comm_key] = samples.get(comm_key, 0) + sc.count
            comms.setdefault(key, set()).add(sc.comm)

        out = []
        for key, samples in profiles.items():
            rooted = not self.per_pid and len(comms[key]) > 1
            ordered = sorted(samples.items(), key=lambda kv: (-kv[1], kv[0]))
            stacks = [([index({"name": comm})] if rooted else []) + list(stack)
                      for (comm, stack), _n in ordered]
            weights = [n * ns_per_sample if ns_per_sample else n for _k, n in ordered]
            name = key[0] if not self.per_pid else f"{key[2]} [{key[1]}] {key[0]}"
            weight = weight_of(self.context)
            if weight is not None:
                name += f" ({weight.label})"
            out.append({"type": "sampled", "name": name,
                        "unit": "nanoseconds" if ns_per_sample else (
                            "bytes" if getattr(self.context, "value_unit", None) == "bytes"
                            or (weight is not None and weight.unit == "bytes")
                            else "none"),
                        "startValue": 0, "endValue": sum(weights),
                        "samples": stacks, "weights": weights})
        return {"$schema": SCHEMA,
                "name": getattr(self.context, "title", "") or "ustack",
                "exporter": "ustack",
                "activeProfileIndex": 0,
                "shared": {"frames": [dict(k) for k in frames]},
                "profiles": out}

    def _ns_per_sample(self) -> int:
        """A profile run's samples are time; counted events are not."""
        context = self.context
        if is_timed(context):
            return 1                      # the counts are nanoseconds already
        if getattr(context, "command", "") == "profile" and context.frequency:
            return 1_000_000_000 // context.frequency
        return 0
