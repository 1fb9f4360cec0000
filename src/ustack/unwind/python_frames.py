"""A thread's Python frames read from its process's memory (user space:
`ustack dump`, while the thread is stopped), and the merge of them into its
native stack (PYTHON.md's rule, the one the in-kernel walk follows).

The reader follows the Interpreter's layout (python_runtime.py): the
runtime's first interpreter, its thread states, the one whose thread id is
the thread's pthread_self() (its fs_base), that thread's current frame and
the `previous` chain. It returns the frames in groups, one group per C
call of the eval function, innermost first."""
from __future__ import annotations

import struct
from collections.abc import Callable

from ..model import PYTHON_INDEX_MAX, python_frame_word
from .python_runtime import (FRAME_OWNED_BY_CSTACK, IS_ENTRY, LASTI_BYTES,
                             LASTI_UNITS, NONE, ONE_PER_EVAL, Interpreter)

MAX_THREADS = 4096              # thread states followed at most (a cycle ends it)
MAX_PY_FRAMES = 4096            # frames followed at most per thread
UNREADABLE = "Python frames not shown: the thread's frame chain could not be read"
LEFT = "Python frames left after the native walk ended: not shown"
NO_EVAL = "Python frames not shown: no eval call of the interpreter was found on the native stack"

Read = Callable[[int, int], bytes]      # (address, size) -> bytes, OSError if unreadable


def _word(read: Read, addr: int) -> int:
    return struct.unpack("<Q", read(addr, 8))[0]


def thread_state(read: Read, interp: Interpreter, thread_id: int) -> int:
    """The PyThreadState address of the thread whose pthread_self() is
    thread_id, or 0 when the interpreter has none (a thread Python never
    ran on)."""
    f = dict(interp.layout)
    head = _word(read, interp.runtime + f["runtime_interp_head"])
    if not head:
        return 0
    tstate = _word(read, head + f["interp_tstate_head"])
    for _ in range(MAX_THREADS):
        if not tstate:
            return 0
        if _word(read, tstate + f["tstate_thread_id"]) == thread_id:
            return tstate
        tstate = _word(read, tstate + f["tstate_next"])
    return 0


def thread_groups(read: Read, interp: Interpreter, thread_id: int) -> list:
    """The thread's Python frames as (code address, code-unit index)
    pairs, grouped by the eval call that runs them: a list of lists,
    innermost first. Raises OSError when the chain cannot be read."""
    f = dict(interp.layout)
    tstate = thread_state(read, interp, thread_id)
    if not tstate:
        return []
    frame = _word(read, tstate + f["tstate_frame"])
    if frame and f["cframe_current_frame"] != NONE:
        frame = _word(read, frame + f["cframe_current_frame"])
    entry, kind = f["entry_kind"], f["instr_kind"]
    groups: list = []
    group: list = []
    for _ in range(MAX_PY_FRAMES):
        if not frame:
            break
        if entry not in (ONE_PER_EVAL, IS_ENTRY):    # OWNER_CSTACK: a shim ends the group
            if read(frame + f["frame_entry"], 1)[0] == FRAME_OWNED_BY_CSTACK:
                groups.append(group)
                group = []
                frame = _word(read, frame + f["frame_previous"])
                continue
        code = _word(read, frame + f["frame_code"])
        group.append((code, _index(read, frame, code, f, kind)))
        if entry == ONE_PER_EVAL or (entry == IS_ENTRY and read(frame + f["frame_entry"], 1)[0]):
            groups.append(group)
            group = []
        frame = _word(read, frame + f["frame_previous"])
    else:
        raise OSError("the frame chain does not end")
    if group:
        groups.append(group)
    return groups


def _index(read: Read, frame: int, code: int, f: dict, kind: int) -> int:
    """The code-unit index of the frame's instruction (0 before its first)."""
    if kind in (LASTI_BYTES, LASTI_UNITS):
        lasti = struct.unpack("<i", read(frame + f["frame_instr"], 4))[0]
        at = lasti >> 1 if kind == LASTI_BYTES else lasti
    else:
        at = (_word(read, frame + f["frame_instr"]) - code - f["code_bytecode"]) >> 1
    return max(0, min(at, PYTHON_INDEX_MAX))


def merge(native_pcs, groups, eval_ranges) -> tuple:
    """(words innermost first, notes): each native pc inside the eval
    function replaced by its call's Python frames (tagged words,
    model.python_frame_word), other native frames where they are. An eval
    call starting (its frame not current yet) or ending is the innermost:
    when eval frames outnumber the groups, that many innermost eval frames
    stay as C frames, so the rest pair with the right groups."""
    def in_eval(i, pc):
        q = pc - 1 if i else pc            # return addresses point past the call
        return any(lo <= q < hi for lo, hi in eval_ranges)

    evals = sum(1 for i, pc in enumerate(native_pcs) if in_eval(i, pc))
    skip = max(0, evals - len(groups))
    words: list = []
    notes: list = []
    left = list(groups)
    for i, pc in enumerate(native_pcs):
        if in_eval(i, pc):
            if skip:
                skip -= 1
            elif left:
                words.extend(python_frame_word(code, index) for code, index in left.pop(0))
                continue
        words.append(pc)
    if any(left):
        notes.append(LEFT if evals else NO_EVAL)
    return tuple(words), tuple(notes)
