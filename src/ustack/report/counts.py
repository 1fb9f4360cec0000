"""Aggregated stacks: merge per symbolized stack, then print least to most
frequent (bcc stackcount's order) or as folded lines for flame graphs."""
from __future__ import annotations

from ..model import StackCount
from .text import frame_label


def stack_identity(sc: StackCount, per_pid: bool, offsets: bool) -> tuple:
    """What makes two counted stacks "the same" once symbolized: the named
    frames, not addresses, so ASLR'd processes of one binary merge. By
    function, as bcc's stackcount and profile do; by call site (function and
    offset) when `offsets` is asked for."""
    frames = tuple((f.module, f.function,
                    f.offset if offsets and f.function else 0)
                   for f in sc.stack.frames)    # unnamed: by module (ASLR)
    return (sc.pid if per_pid else 0, sc.comm if per_pid else "", frames,
            sc.stack.notes)


def merge(counts, per_pid: bool = False, offsets: bool = False) -> list:
    merged: dict = {}
    for sc in counts:
        key = stack_identity(sc, per_pid, offsets)
        have = merged.get(key)
        if have is None:
            merged[key] = StackCount(sc.comm, sc.pid, sc.stack, sc.count, sc.event)
        else:
            have.count += sc.count
    return sorted(merged.values(), key=lambda s: s.count)


def function_label(f) -> str:
    """`func [module]`: a frame without the call site's offset."""
    module = f" [{f.module}]" if f.module else ""
    return f"{f.function or '[unknown]'}{module}"


def format_counts(counts, per_pid: bool = False, offsets: bool = False) -> str:
    """bcc stackcount's layout: frames innermost first, then the count."""
    label = frame_label if offsets else function_label
    out = []
    for sc in merge(counts, per_pid, offsets):
        out.extend(f"  {label(f)}" for f in sc.stack.frames)
        out.extend(f"  ({note})" for note in sc.stack.notes)
        if per_pid:
            out.append(f"    {sc.comm} [{sc.pid}]")
        out.append(f"    {sc.count}")
        out.append("")
    return "\n".join(out) + ("\n" if out else "")


def folded_name(f) -> str:
    if f.function:
        return f.function.replace(";", ":").replace(" ", "_")
    return f"[{f.module}]" if f.module else "[unknown]"


def format_folded(counts, per_pid: bool = False) -> str:
    """`comm;outermost;…;innermost COUNT`, as FlameGraph's stackcollapse
    scripts and bcc `profile -f` write it."""
    lines: dict = {}
    for sc in counts:
        names = [folded_name(f) for f in reversed(sc.stack.frames)]
        head = f"{sc.comm}-{sc.pid}" if per_pid else sc.comm
        line = ";".join([head.replace(" ", "_")] + names)
        lines[line] = lines.get(line, 0) + sc.count
    return "".join(f"{line} {n}\n" for line, n in
                   sorted(lines.items(), key=lambda kv: (kv[1], kv[0])))
