"""Each thread's Python frames read from a CPython process's memory in user
space (the interpreter's state by python_runtime's layout), and the merge
rule that puts them in place of the eval function's native frames.

A thread's frames come as groups, innermost first: a group is what one C
call of the eval function runs (one frame up to 3.10; up to an is_entry
frame in 3.11; up to a C-stack shim in 3.12+)."""
from __future__ import annotations

import struct

from ..kernel.procfs import ProcessMemory
from ..model import python_frame_word
from .python_runtime import (FRAME_OWNED_BY_CSTACK, INSTR_POINTER, IS_ENTRY,
                             LASTI_BYTES, NONE, OWNER_CSTACK, Interpreter)

MAX_THREADS = 4096          # a thread list longer than this is not a list
MAX_FRAMES = 4096           # Python frames of one thread (recursion limit: 1000)
# why a chain was cut where it comes back to a frame read before: damaged
# memory (a `previous` pointing at itself or at an inner frame)
LOOPS = "the Python frame chain loops back on itself (damaged memory)"
_Q, _I = struct.Struct("<Q"), struct.Struct("<i")

# A code object is named in a frame word by an id that stands for (its
# process, its address, its identity): an address alone is shared by every
# code object made there, one after another. The kernel's ids (bpf/
# python.h code_id) end in the CPU that made them; user space's in
# USER_ID_CPU.
ID_CPU_BITS, USER_ID_CPU = 12, 4095
FNV_BASIS, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
_M64 = (1 << 64) - 1
_U32 = struct.Struct("<I")
FREE_LIST_REACH = 1 << 20       # a pymalloc arena: a free block's link points within it
# a frame word's id (bpf/python.h): frames left out of a deep stack, their
# count its index (0: C frames left out, the Python chain going on after)
PY_CUT = 0


def _mix(h: int, word: int) -> int:
    h = ((h ^ word) * FNV_PRIME) & _M64
    return h ^ (h >> 29)


def code_identity(head: bytes, offsets: dict) -> int:
    """What tells a code object from another made at its address later,
    from its first bytes `head` (CODE_OFFSETS' `offsets`): its type,
    first line, file and name objects, mixed as bpf/python.h's
    code_identity does."""
    name = offsets["qualname"] if offsets["qualname"] is not None else offsets["name"]
    h = _mix(FNV_BASIS, _Q.unpack_from(head, 8)[0])
    h = _mix(h, _U32.unpack_from(head, offsets["firstlineno"])[0])
    h = _mix(h, _Q.unpack_from(head, offsets["filename"])[0])
    h = _mix(h, _Q.unpack_from(head, name)[0])
    return h or 1


def freed(head: bytes, addr: int) -> bool:
    """Whether the object whose first bytes are `head` lies freed at
    `addr`, its fields still there: pymalloc writes a free block's first
    word (ob_refcnt) with the next free block of its pool (or 0 for none),
    an address near its own; a live object's count is no such number."""
    refcnt = _Q.unpack_from(head, 0)[0]
    return refcnt == 0 or abs(refcnt - addr) < FREE_LIST_REACH


def ascii_data(version: tuple) -> int:
    """Where a compact ASCII str's characters start, from the object's
    start: sizeof(PyASCIIObject) (3.12 dropped its wstr field)."""
    return 48 if tuple(version[:2]) <= (3, 11) else 40


def identity_span(offsets: dict) -> int:
    """The bytes of a code object's head code_identity reads."""
    name = offsets["qualname"] if offsets["qualname"] is not None else offsets["name"]
    return max(16, offsets["filename"] + 8, name + 8, offsets["firstlineno"] + 4)


def thread_states(mem: ProcessMemory, interp: Interpreter) -> dict:
    """thread_id (pthread_self(), the task's fs_base) -> its PyThreadState
    address, for the threads of the main interpreter."""
    f = dict(interp.layout)
    tstate = mem.word(mem.word(interp.runtime + f["runtime_interp_head"])
                      + f["interp_tstate_head"])
    out: dict = {}
    while tstate and len(out) < MAX_THREADS:
        out[mem.word(tstate + f["tstate_thread_id"])] = tstate
        tstate = mem.word(tstate + f["tstate_next"])
    return out


def frame_groups(mem: ProcessMemory, interp: Interpreter, tstate: int) -> tuple:
    """(groups, note): the thread's Python frames as groups of (code,
    index), innermost first; note says why the chain was cut, or "".
    Each frame's fields come in one read (a sampled thread's frames are
    read per sample)."""
    f = dict(interp.layout)
    frame = _current(mem, f, tstate)
    kind, entry = f["entry_kind"], f["frame_entry"]
    at_code, at_previous, at_instr = f["frame_code"], f["frame_previous"], f["frame_instr"]
    span = max(at_code, at_previous, at_instr, entry if entry != NONE else 0) + 8
    pointer = f["instr_kind"] == INSTR_POINTER
    bytecode = f["code_bytecode"]
    units = f["instr_kind"] != LASTI_BYTES
    groups: list = []
    group: list = []
    note = ""
    read: set = set()
    try:
        for _ in range(MAX_FRAMES):
            if not frame:
                break
            if frame in read:
                note = LOOPS
                break
            read.add(frame)
            head = mem.read(frame, span)
            if kind == OWNER_CSTACK and head[entry] == FRAME_OWNED_BY_CSTACK:
                if group:
                    groups.append(tuple(group))
                group = []
            else:
                code = _Q.unpack_from(head, at_code)[0]
                if pointer:         # a pointer into the code's bytecode
                    index = max(0, (_Q.unpack_from(head, at_instr)[0] - (code + bytecode)) // 2)
                else:               # f_lasti: in bytes (3.8, 3.9) or code units; -1 before the first
                    lasti = _I.unpack_from(head, at_instr)[0]
                    index = 0 if lasti < 0 else lasti if units else lasti // 2
                group.append((code, index))
                if kind != OWNER_CSTACK and (kind != IS_ENTRY or head[entry]):
                    groups.append(tuple(group))   # one frame per eval call, or is_entry
                    group = []
            frame = _Q.unpack_from(head, at_previous)[0]
        else:
            note = f"Python frames cut after {MAX_FRAMES}"
    except OSError:
        note = "a Python frame could not be read"
    if group:
        groups.append(tuple(group))
    return tuple(groups), note


def current_frame(mem: ProcessMemory, interp: Interpreter, tstate: int) -> int:
    """The address of the thread's current Python frame (0: none)."""
    return _current(mem, dict(interp.layout), tstate)


def _current(mem: ProcessMemory, f: dict, tstate: int) -> int:
    frame = mem.word(tstate + f["tstate_frame"])
    if frame and f["cframe_current_frame"] != NONE:
        frame = mem.word(frame + f["cframe_current_frame"])
    return frame


def in_ranges(pc: int, ranges) -> bool:
    for lo, hi in ranges:
        if lo <= pc < hi:
            return True
    return False


def eval_frames(pcs, eval_ranges) -> list:
    """Which native frames are the eval function's (a return address is
    looked up one byte back, in its call)."""
    return [in_ranges(pc - 1 if n else pc, eval_ranges) for n, pc in enumerate(pcs)]


def merge(pcs, groups, eval_ranges, evals: list | None = None) -> tuple:
    """(words, notes): the native pcs (innermost first; all but the first
    are return addresses) with each one in an eval range replaced by the
    next group's tagged Python words (model.python_frame_word); native
    frames between stay. Groups left over give a note, never a guessed
    frame. An eval call starting (its frame not current yet) or ending (its
    frame gone already) is the innermost one: when eval frames outnumber
    the groups, that many innermost ones stay C frames, so the rest pair
    with the right groups (as the in-kernel walk does, bpf/python.h).
    `evals`: eval_frames(pcs, eval_ranges), where the caller has it."""
    out: list = []
    notes: list = []
    left = list(groups)
    if evals is None:
        evals = eval_frames(pcs, eval_ranges)
    skip = max(0, sum(evals) - len(left))
    for pc, is_eval in zip(pcs, evals):
        if is_eval and skip:
            skip -= 1
        elif is_eval:                   # a group for each: none was skipped
            out.extend(python_frame_word(code, index) for code, index in left.pop(0))
            continue
        out.append(pc)
    if left:
        notes.append(f"{sum(len(g) for g in left)} Python frames beyond the native stack")
    return tuple(out), tuple(notes)


def merge_outer_cut(pcs, groups, eval_ranges, flags: list) -> tuple:
    """(words, notes) of a native stack whose copy ended before its
    outermost frames (a recursion deeper than the copy): its eval frames
    are the innermost ones and pair with the innermost groups, up to a
    group holding a PY_CUT word (a deep chain's middle, left out by the
    kernel); the native frames from the first eval frame left unpaired
    are not shown, and the groups left follow a PY_CUT word of count 0
    (C frames left out), so the outermost Python frames (main, <module>)
    show. The caller checked the innermost eval frame ran the current
    Python frame."""
    evals = [n for n, is_eval in enumerate(flags) if is_eval]
    before_cut = next((n for n, g in enumerate(groups)
                       if any(code == PY_CUT << 3 for code, _index in g)), len(groups))
    paired = min(len(evals), before_cut)
    end = evals[paired] if paired < len(evals) else len(pcs)
    words, _ = merge(pcs[:end], groups[:paired], eval_ranges, flags[:end])
    rest = [python_frame_word(code, index) for g in groups[paired:] for code, index in g]
    if not rest:
        return words, ()
    return words + (python_frame_word(PY_CUT << 3, 0),) + tuple(rest), ()


def merge_read(pcs, python: tuple, whole: bool, regs: dict, stack, sps: list,
               copy_cut: bool = False) -> tuple:
    """(words, notes) of a copied stack and the Python frames read from its
    process after the sample (model.PythonSample.python): merged only when
    the read agrees with the sample, else the C frames stay and a note
    says why (the thread may have returned or called on meanwhile: a
    guessed frame would hide it). It agrees when there is one group per
    eval frame of the native stack and the thread's current frame then
    is the one the innermost eval frame ran: a pointer the eval loop
    keeps in a register (`regs`, the sampled ones) or on the stack copy
    (`stack`, from the sampled sp) at or below that frame (`sps`: each
    native frame's sp). `whole`: the native walk reached the stack's end
    (else its eval frames cannot be counted). `copy_cut`: it ended only
    where the stack copy ended: its eval frames are the innermost ones,
    merged as far as they go (merge_outer_cut)."""
    groups, note, eval_ranges, current = python
    flags = eval_frames(pcs, eval_ranges)
    evals = [n for n, is_eval in enumerate(flags) if is_eval]
    if not evals and not groups:
        return tuple(pcs), ()
    if note:
        return tuple(pcs), (f"Python frames not shown: {note}",)
    if not whole and not (copy_cut and evals and len(evals) <= len(groups)):
        return tuple(pcs), ("Python frames not shown: the native stack is incomplete",)
    if whole and len(evals) != len(groups):
        return tuple(pcs), (f"Python frames not shown: read after the sample, the thread "
                            f"ran {len(groups)} eval calls where the stack has {len(evals)}",)
    inner = evals[0] + 1
    end = sps[inner] - sps[0] if inner < len(sps) else len(stack)
    if current not in regs.values() and current.to_bytes(8, "little") not in bytes(stack[:end]):
        return tuple(pcs), ("Python frames not shown: read after the sample, the thread "
                            "was in another Python frame",)
    if not whole:
        return merge_outer_cut(pcs, groups, eval_ranges, flags)
    return merge(pcs, groups, eval_ranges, flags)
