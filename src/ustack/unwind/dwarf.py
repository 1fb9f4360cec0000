"""DWARF unwinding of a copied user stack (perf's --call-graph dwarf): from
the sampled registers and the bytes above sp, step from frame to caller with
the CFI rules of cfi.py, falling back to the frame pointer where an object
has no CFI, and crossing signal frames.

Speed is the point of the shape of unwind(): every (mapping, pc) is resolved
once into a small tuple and kept, so a frame costs a dict lookup and one or
two struct reads; mapping lookups are skipped while frames stay inside the
mapping of the previous frame."""
from __future__ import annotations

import os
import struct
from collections.abc import Callable

from ..model import JIT_NOTE, OTHER_AT, OTHER_STACK, Mapping, UstackError
from ..objfile import prologue
from ..objfile.elf import ElfImage
from ..objfile.mapped import file_offset, object_path
from . import cfi, cfi_index, packed_lookup, tables
from .cfi import UnwindTable
from .restore_rt import RESTORE_RT, just_after_trampoline  # noqa: F401 (dwarf.X, as before)

# Far beyond the kernel's perf_event_max_stack (127), so deep recursion is
# not cut; a stack copy of 64 KiB holds at most ~4000 minimal frames anyway.
MAX_FRAMES = 1024
# Rule kinds of the per-pc cache, a tuple (kind, cfa_off, ra_off, bp_rule,
# bp_off, aux, bx_rule, bx_off, note): CFA = rsp|rbp|rbx + cfa_off, or
# [rsp|rbp + cfa_off] + aux for the _DEREF kinds; the return address at
# CFA + ra_off; rbp per cfi.BP_*, rbx per cfi.BX_*; note is what to tell
# the user, or None.
_SP, _BP, _SP_DEREF, _BP_DEREF, _END, _SIGNAL, _STOP, _BX = range(1, 9)
# CFA = rbp + 16, ra [rbp + 8], rbp [rbp]; rbx unknown (no CFI says)
_FP_RULE = (16, -8, cfi.BP_AT, -16, 0, cfi.BX_LOST, 0)
# what a frame whose CFA is rbx-based says when rbx is not known there
BX_UNKNOWN_NOTE = ("stack cut at a frame whose CFA is rbx-based (ld.so's lazy-binding "
                   "resolver): rbx is not known there")
# The rt_sigframe's ucontext_t sits at sp once the handler has returned into
# __restore_rt; uc_mcontext.gregs starts 40 bytes in, in the order R8..R15,
# RDI, RSI, RBP, RBX, RDX, RAX, RCX, RSP, RIP.
_GREGS = 40
_UC_RBP, _UC_RBX = _GREGS + 8 * 10, _GREGS + 8 * 11
_UC_RSP, _UC_RIP = _GREGS + 8 * 15, _GREGS + 8 * 16
_TRUNC_LIMIT = 64 << 20  # reads further above the copy are garbage, not a short copy
_MAX_PCS = 1 << 17       # cached pcs per mapping before the cache is dropped
_MAX_MAPPINGS = 1 << 12
_Q = struct.Struct("<Q")


# What a cut stack advises by default; a capture whose copy cannot grow
# (tracefs: the kernel's per-event limit) gives the unwinder its own.
RAISE_STACK_SIZE = "raise --stack-size"


# how a note of a stack the copy cut short begins
TRUNCATED = "stack copy too small"


def truncation_note(size: int, advice: str = RAISE_STACK_SIZE) -> str:
    return f"{TRUNCATED} ({size} bytes): the stack was cut short; {advice}"


class _MapState:
    """What unwinding needs about one mapping, and its per-pc rule cache."""
    __slots__ = ("mapping", "start", "end", "module", "image", "table",
                 "why", "exact", "ret")

    def __init__(self, m: Mapping):
        self.mapping = m
        self.start, self.end = m.start, m.end
        self.module = os.path.basename(m.path) if m.path.startswith("/") else (m.path or "[anon]")
        self.image: ElfImage | None = None
        self.table: UnwindTable | None = None
        self.why = "no CFI"             # why frames here use the frame pointer
        self.exact: dict = {}           # pc -> rule, pc exact (leaf, interrupted)
        self.ret: dict = {}             # pc -> rule, pc a return address


class DwarfUnwinder:
    """Unwinds copied user stacks; holds the caches, so keep one per run.
    debug_dirs: where else to look for separate debug files (--debug-dir),
    whose .debug_frame fills an object's CFI gaps. `warnings` collects the
    debug files refused (wrong build-id or CRC, unreadable), one sentence each."""

    def __init__(self, max_frames: int = MAX_FRAMES, debug_dirs=(),
                 cut_advice: str = RAISE_STACK_SIZE):
        self.max_frames = max_frames
        self.cut_advice = cut_advice    # what a stack cut by its copy's size advises
        self.debug_dirs = tuple(debug_dirs)
        self._states: dict = {}         # id(Mapping) -> _MapState (holds the Mapping)
        self.warnings: list = []

    def unwind(self, regs: dict, stack: bytes,
               find_mapping: Callable[[int], Mapping | None], sps: list | None = None,
               fps: list | None = None, end: list | None = None,
               exact: bool = True) -> tuple:
        """(addresses innermost first, notes). addrs[0] is regs['ip'];
        the others are return addresses, except a pc interrupted by a
        signal, which is exact. `sps`: a list given gets each frame's sp;
        `fps`: each frame's frame pointer where it was walked on it (code
        without CFI: a JIT's, V8's builtins), else 0. `end`: a list given
        gets the last frame's sp and bp (None: not known), to go on from
        there (a JVM's Java frames: hotspot_live.py); `exact`: False where
        regs['ip'] is a return address, not the pc of an event."""
        ip = regs["ip"]
        sp = sp0 = regs["sp"]
        bp = regs.get("bp")
        bx = regs.get("bx")     # None: not sampled (or lost): rbx-based CFAs stop
        other_at = regs.get(OTHER_AT)       # a copy of another stack follows
        if other_at is not None:
            other = (regs[OTHER_STACK], stack[other_at:])
            stack = stack[:other_at]
        top = len(stack) - 8
        addrs = [ip]
        if sps is not None:
            sps.append(sp)
        notes: list = []
        states = self._states
        unpack = _Q.unpack_from
        st = None
        lo = hi = 0
        walked_fp: dict = {}                    # frame index -> its frame pointer
        switched = False                        # this frame ran on another stack
        for _ in range(self.max_frames - 1):
            q = ip if exact else ip - 1          # return addresses point past the call
            if not lo <= q < hi:
                m = find_mapping(q)
                if m is None:
                    st, lo, hi = None, 0, 0
                else:
                    st = states.get(id(m))
                    if st is None or st.mapping is not m:
                        st = self._state(m)
                    lo, hi = st.start, st.end
            if st is None:
                rule = _NO_MAPPING_LEAF if exact else _NO_MAPPING
            else:
                rule = (st.exact if exact else st.ret).get(ip)
                if rule is None:
                    rule = self._rule(st, ip, exact)
            kind, cfa_off, ra_off, bp_rule, bp_off, aux, bx_rule, bx_off, note = rule
            if kind == _SP:
                cfa = sp + cfa_off
            elif kind == _BP:
                if bp is None:
                    break
                cfa = bp + cfa_off
                if note is not None and fps is not None:     # no CFI: on the frame pointer
                    walked_fp[len(addrs) - 1] = bp
                if aux == tables.STACK_SWITCH:
                    # a frame on another stack than its CFA's (Go's vDSO
                    # calls): its callers are in the copy from rbp, if any
                    o = cfa + ra_off - sp0
                    if not 0 <= o <= top and other_at is not None:
                        sp0, stack = other
                        top = len(stack) - 8
                        other_at = None
                    switched = True
            elif kind == _BX:
                if bx is None:
                    if BX_UNKNOWN_NOTE not in notes:
                        notes.append(BX_UNKNOWN_NOTE)
                    break
                cfa = bx + cfa_off
            elif kind == _SP_DEREF or kind == _BP_DEREF:
                base = sp if kind == _SP_DEREF else bp
                if base is None:
                    break
                o = base + cfa_off - sp0
                if o < 0 or o > top:
                    _short(notes, len(stack), o, top, self.cut_advice)
                    break
                cfa = unpack(stack, o)[0] + aux
            elif kind == _SIGNAL:
                o = sp - sp0
                if o < 0 or o + _UC_RIP > top:
                    _short(notes, len(stack), o + _UC_RIP, top, self.cut_advice)
                    break
                bp = unpack(stack, o + _UC_RBP)[0]
                bx = unpack(stack, o + _UC_RBX)[0]
                sp = unpack(stack, o + _UC_RSP)[0]
                ip = unpack(stack, o + _UC_RIP)[0]
                if ip < 0x1000:
                    break
                addrs.append(ip)
                if sps is not None:
                    sps.append(sp)
                exact = True                      # the interrupted pc itself
                continue
            else:                                 # _END: the outermost frame; _STOP
                if note is not None and note not in notes:
                    notes.append(note)          # a stop that says why
                break
            o = cfa + ra_off - sp0
            if o < 0 or o > top:
                _short(notes, len(stack), o, top, self.cut_advice)
                break
            ra = unpack(stack, o)[0]
            if bp_rule:
                if bp_rule == cfi.BP_AT:
                    o = cfa + bp_off - sp0
                    bp = unpack(stack, o)[0] if 0 <= o <= top else None
                elif bp_rule == cfi.BP_AT_BP and bp is not None:
                    o = bp + bp_off - sp0
                    bp = unpack(stack, o)[0] if 0 <= o <= top else None
                else:
                    bp = None
            if bx_rule:
                o = cfa + bx_off - sp0
                bx = unpack(stack, o)[0] if bx_rule == cfi.BX_AT and 0 <= o <= top else None
            if ra < 0x1000 or (cfa <= sp and not switched):   # end of chain, or no progress
                break
            switched = False
            sp = cfa
            ip = ra
            exact = False
            addrs.append(ra)
            if sps is not None:
                sps.append(sp)
            # noted only when the fallback gave a frame: at the outermost
            # frame (ld.so's _start, rbp 0) it just ends the walk
            if note is not None and note not in notes:
                notes.append(note)
        else:
            notes.append(f"stopped after {self.max_frames} frames")
        if st is None and not notes:        # ended at an address no mapping holds
            notes.append(UNMAPPED_NOTE)
        if fps is not None:
            fps.extend(walked_fp.get(i, 0) for i in range(len(addrs)))
        if end is not None:
            end.extend((sp, bp))
        return tuple(addrs), tuple(notes)

    # --- resolving a pc (cache misses) -------------------------------------------

    def _state(self, m: Mapping) -> _MapState:
        if len(self._states) >= _MAX_MAPPINGS:
            self._states.clear()
        st = _MapState(m)
        path = object_path(m)
        if path is not None:
            try:
                st.image = ElfImage.open(path)
            except UstackError as e:
                st.why = f"cannot read it ({e})"
            else:
                try:
                    # the rows the in-kernel walk uses, where built: a
                    # deferred stack unwound as the kernel would have
                    st.table = packed_lookup.for_unwinder(st.image, self.debug_dirs)
                    if st.table is None:
                        st.table, found = cfi_index.for_unwinder(st.image, self.debug_dirs)
                        for refusal in found.refused:
                            if refusal not in self.warnings:
                                self.warnings.append(refusal)
                except Exception:  # a damaged file: frame pointers, not a failed run
                    st.why = "unreadable CFI"
        self._states[id(m)] = st
        return st

    def _rule(self, st: _MapState, pc: int, exact: bool) -> tuple:
        cache = st.exact if exact else st.ret
        if len(cache) >= _MAX_PCS:
            cache.clear()
        try:
            rule = self._compute(st, pc, exact)
        except UstackError:                       # the file went away meanwhile
            rule = (_BP,) + _FP_RULE + (f"frame pointer used for {st.module}: unreadable",)
        cache[pc] = rule
        return rule

    def _compute(self, st: _MapState, pc: int, exact: bool) -> tuple:
        m = st.mapping
        image = st.image
        q = pc if exact else pc - 1
        vaddr = image.file.vaddr_of_file_offset(file_offset(m, q)) if image else None
        row = st.table.lookup(vaddr) if st.table is not None and vaddr is not None else None
        if row is not None:
            kind, cfa_off, ra_off, bp_rule, bp_off, aux, bx_rule, bx_off = row
            if kind in _DIRECT:
                return (_DIRECT[kind], cfa_off, ra_off, bp_rule, bp_off, aux, bx_rule, bx_off,
                        None)
            if kind == cfi.END:
                return (_END, 0, 0, 0, 0, 0, 0, 0, None)
            if kind == cfi.CFA_PLT:               # depends on pc: resolved here
                extra = 8 if (pc & 15) >= aux else 0
                return (_SP, cfa_off + extra, ra_off, bp_rule, bp_off, 0, bx_rule, bx_off, None)
        # No usable CFI: a signal trampoline, or the frame pointer.
        if image is not None and vaddr is not None:
            here = vaddr if exact else vaddr + 1
            if image.file.read(here, len(RESTORE_RT)) == RESTORE_RT:
                return (_SIGNAL, 0, 0, 0, 0, 0, 0, 0, None)
            # the pc just after its syscall: the event of rt_sigreturn itself,
            # or a sample while the kernel runs it
            if exact and just_after_trampoline(image, vaddr):
                return (_SIGNAL, 0, 0, 0, 0, 0, 0, 0, None)
        if row is not None:
            # CFI we do not evaluate (a CFA in rdi, say): rbp there is not
            # a frame pointer, so following it would invent frames
            return (_STOP, 0, 0, 0, 0, 0, 0, 0,
                    f"stack cut at {st.module}: its CFI uses a rule ustack does not evaluate")
        why = st.why
        note = (JIT_NOTE if m.path in ("", "//anon")      # as the in-kernel walk says
                else f"frame pointer used for {st.module}: {why}")
        if exact and image is not None and vaddr is not None:
            leaf = _leaf_rule(image, vaddr)
            if leaf is not None:
                return leaf + (note,)
        return (_BP,) + _FP_RULE + (note,)


_DIRECT = {cfi.CFA_SP: _SP, cfi.CFA_BP: _BP, cfi.CFA_SP_DEREF: _SP_DEREF,
           cfi.CFA_BP_DEREF: _BP_DEREF, cfi.CFA_BX: _BX}
# A pc outside every known mapping: a leaf (JIT code, say) may still have a
# frame pointer; a return address there means the walk already went wrong.
_NO_MAPPING_LEAF = (_BP,) + _FP_RULE + ("frame pointer used for [unknown]: no mapping",)
_NO_MAPPING = (_STOP, 0, 0, 0, 0, 0, 0, 0, None)
# ... where the walk ends there: what tracefs gives for a library dlopen'd
# after ustack read the maps of a process that exited before it read them
# again; on perf and bpf (which see every mapping), a stack sampled inside
# execve: the old program's registers, the new program's maps
UNMAPPED_NOTE = ("stack cut at [unknown]: the address is in no mapping ustack saw in "
                 "this process (with tracefs, mapped and gone between two reads of its "
                 "maps: --backend perf or bpf record every mapping; else sampled as "
                 "the process exec'd)")


def _short(notes: list, size: int, offset: int, top: int, advice: str) -> None:
    """A read at stack offset `offset` failed: above the copy (but not wildly)
    means the copy was too small; anything else is a garbage pointer."""
    if top < offset < _TRUNC_LIMIT or (top < 0 and offset >= 0):
        note = truncation_note(size, advice)
        if note not in notes:
            notes.append(note)


def _leaf_rule(image: ElfImage, vaddr: int) -> tuple | None:
    """The CFA rule of a leaf without CFI, from its prologue; None: use rbp."""
    found = prologue.leaf_frame(image, vaddr)
    if found is None:
        return None
    depth, bp_off = found
    if bp_off is None:
        return (_SP, depth + 8, -8, cfi.BP_SAME, 0, 0, cfi.BX_LOST, 0)
    return (_SP, depth + 8, -8, cfi.BP_AT, bp_off, 0, cfi.BX_LOST, 0)
