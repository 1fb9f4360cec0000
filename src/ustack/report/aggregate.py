"""Counted stacks merged once symbolized: what every aggregate format
(counts, folded, and those to come) starts from."""
from __future__ import annotations


from ..model import StackCount, unnamed_function
from ..values import replace


def stack_identity(sc: StackCount, per_pid: bool, offsets: bool) -> tuple:
    """What makes two counted stacks "the same" once symbolized: the named
    frames, not addresses, so ASLR'd processes of one binary merge. By
    function, as bcc's stackcount and profile do; by call site (function and
    offset) when `offsets` is asked for. Events stay apart: a stack of
    two events is two counts, as each event's own."""
    frames = tuple((f.module, f.function or unnamed_function(f),
                    f.offset if offsets and (f.function or f.objstart) else 0,
                    f.file, f.line, f.inlined)    # lines, when asked for, split
                   for f in sc.stack.frames)    # unnamed: by place in its object
    return (sc.event, sc.pid if per_pid else 0, sc.tid if per_pid else 0,
            sc.comm if per_pid else "", frames, sc.stack.notes)


def merge(counts, per_pid: bool = False, offsets: bool = False) -> list:
    """StackCounts with one entry per identity, least frequent first."""
    merged: dict = {}
    for sc in counts:
        key = stack_identity(sc, per_pid, offsets)
        have = merged.get(key)
        if have is None:
            merged[key] = replace(sc)
        else:
            have.count += sc.count
    return sorted(merged.values(), key=lambda s: s.count)
