"""A function's first instructions: whether it sets up a frame pointer, and
where its return address sits before it has. Three users, one decoder:
probes (the return-address slot at a probed instruction), the DWARF
unwinder (a leaf pc in code without CFI) and the unwind policy (does a
binary keep frame pointers)."""
from __future__ import annotations

import functools

from .elf import ElfImage, Symbol

PUSH_RBP_MOV_RSP_RBP = b"\x55\x48\x89\xe5"
PROLOGUE_BYTES = 32      # where -O2 code may still set up its frame
LEAF_SCAN = 256          # bytes of a function disassembled to place a leaf pc
# Go's stack-bound check opens every function that can grow its stack:
# cmp 0x10(%r14),%rsp (small frames) or cmp 0x10(%r14),%r12 after a lea.
_GO_CHECK = (b"\x49\x3b\x66\x10", b"\x4d\x3b\x66\x10")
_ENDS_LINEAR = frozenset(("ret", "leave", "jmp", "enter", "iretq", "ud2", "int3", "hlt"))


@functools.lru_cache(maxsize=2)
def _decoder(detail: bool):
    """One x86-64 decoder per level of detail; detail (registers read and
    written) costs time, so only the probe check asks for it."""
    import capstone  # loaded on first use: most runs never disassemble
    cs = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cs.detail = detail
    return cs


def instructions(code: bytes, addr: int):
    """Capstone instructions with detail (regs_access), for the probe check."""
    return _decoder(True).disasm(code, addr)


def _lite(code: bytes, addr: int):
    """(address, size, mnemonic, operands) tuples: the fast decoding."""
    return _decoder(False).disasm_lite(code, addr)


decode = _lite    # for the other stages (probes/return_sites.py)


def _sets_up_frame(mnem: str, ops: str) -> bool:
    """rbp now holds this function's frame: `mov %rsp,%rbp`, or Go's
    `lea N(%rsp),%rbp` after `sub $N,%rsp; mov %rbp,X(%rsp)`."""
    return ((mnem == "mov" and ops == "rbp, rsp")
            or (mnem == "lea" and ops.startswith("rbp, [rsp")))


def _rsp_immediate(ops: str) -> int:
    """N of `sub/add rsp, N`; ValueError when it is no constant."""
    return int(ops[5:], 0)


def _is_rsp_arith(mnem: str, ops: str) -> bool:
    return (mnem == "sub" or mnem == "add") and ops.startswith("rsp, ")


# --- unwind policy -------------------------------------------------------------

def sets_up_frame_pointer(image: ElfImage, func: Symbol) -> bool:
    """Whether `push %rbp; mov %rsp,%rbp` is among func's first bytes
    (-O2 shrink-wraps: the frame may be set up after an early-exit test)."""
    return PUSH_RBP_MOV_RSP_RBP in (image.file.read(func.address, PROLOGUE_BYTES) or b"")


# --- probes: the return-address slot at a probed instruction --------------------

def return_address_slot(prefix: list, code: bytes, start: int, vaddr: int) -> int | None:
    """Words between sp and the return address at vaddr, following the
    straight-line path of `prefix` (the instructions from the function's
    start, `code`, up to vaddr); None once rbp holds a frame (the kernel's
    frame-pointer walk then finds the caller) or when unsure."""
    if any(start < t <= vaddr for t in _branch_targets(code, start)):
        return None  # vaddr is also reached by a jump: depth unknown
    from capstone.x86 import X86_REG_RSP
    depth = 0
    for insn in prefix:
        mnem, ops = insn.mnemonic, insn.op_str
        if _sets_up_frame(mnem, ops):
            return None
        if mnem in ("ret", "jmp") or mnem.startswith(("leave", "enter")):
            return None
        if X86_REG_RSP not in insn.regs_access()[1]:
            continue
        if mnem in ("push", "pushfq"):
            depth += 1
        elif mnem in ("pop", "popfq"):
            depth -= 1
        elif _is_rsp_arith(mnem, ops):
            try:
                n = _rsp_immediate(ops)
            except ValueError:
                return None
            if n % 8:
                return None
            depth += n // 8 if mnem == "sub" else -(n // 8)
        elif mnem != "call":  # a call returns with rsp unchanged
            return None
    return depth if depth >= 0 else None


def frame_pointer_cfa(code: bytes, start: int, vaddr: int) -> int | None:
    """N where the CFA is %rbp + N at vaddr: the function (`code` from
    `start`) opens with `push %rbp; mov %rsp,%rbp` (unoptimized code), and
    every instruction from there to vaddr leaves rbp holding that frame
    (an epilogue's `leave`/`pop %rbp` ends it; the code after a `ret` or
    `jmp` is reached by a jump from the body, so it is framed again).
    None when vaddr is not inside such a frame, or when unsure."""
    seen, framed = 0, False
    for addr, _size, mnem, ops in _lite(code, start):
        if addr >= vaddr:
            return 16 if framed else None
        if seen == 0 and mnem == "endbr64":
            continue
        seen += 1
        if seen == 1:
            if (mnem, ops) != ("push", "rbp"):
                return None
            continue
        if seen == 2:
            if (mnem, ops) != ("mov", "rbp, rsp"):
                return None
            framed = True
            continue
        if mnem.startswith("leave") or (mnem, ops) == ("pop", "rbp"):
            framed = False
        elif mnem.startswith("ret") or mnem == "jmp":
            framed = True           # what follows is reached by a jump from the body
        elif ops.startswith("rbp,") or ops == "rbp":
            return None             # rbp written otherwise: unsure
    return None


def _branch_targets(code: bytes, start: int) -> set:
    out = set()
    for _addr, _size, mnem, ops in _lite(code, start):
        if mnem.startswith(("j", "loop")):
            try:
                out.add(int(ops, 0))
            except ValueError:
                pass  # indirect: unknown target
    return out


# --- unwinding: a leaf pc in code without CFI ------------------------------------

def leaf_frame(image: ElfImage, vaddr: int) -> tuple | None:
    """(depth, bp_off) of a leaf stopped at vaddr, before it has set up its
    frame pointer: the return address is `depth` bytes above sp, the
    caller's rbp saved at CFA + bp_off (CFA = sp + depth + 8), or bp_off is
    None when rbp still holds it. Found by following the pushes and
    `sub $N,%rsp` from the function's start. None: the frame pointer is set
    up (use rbp), or the code is not understood."""
    code = image.file.read(vaddr, 3)
    if code[:1] in (b"\xc3", b"\xc2") or code[:2] == b"\xf3\xc3":
        return 0, None                           # at a ret: [sp] is the return address
    start = _function_start(image, vaddr)
    if start is None:
        return None
    code = image.file.read(start, vaddr - start)
    depth = 0                                    # bytes below the return address
    bp_off = None                                # where the caller's rbp was saved
    at = start
    for at, size, mnem, ops in _lite(code, start):
        if mnem == "push":
            if ops == "rbp" and bp_off is None:
                bp_off = -16 - depth
            depth += 8
        elif mnem == "pop":
            depth -= 8
            if ops == "rbp":
                bp_off = None
        elif _is_rsp_arith(mnem, ops):
            try:
                n = _rsp_immediate(ops)
            except ValueError:
                return None
            depth += n if mnem == "sub" else -n
        elif _sets_up_frame(mnem, ops):
            return None                          # frame pointer set up: rbp is right
        elif mnem == "mov" and ops.startswith("qword ptr [rsp") and ops.endswith("], rbp"):
            if bp_off is None:
                inner = ops[len("qword ptr [rsp"):-len("], rbp")].replace(" ", "")
                try:
                    bp_off = (int(inner, 0) if inner else 0) - 8 - depth
                except ValueError:
                    return None
        elif mnem in _ENDS_LINEAR or (ops.startswith("rsp") and mnem not in ("cmp", "test")):
            return None                          # past an exit, or rsp changed oddly
        at += size
    if at != vaddr or depth < 0:
        return None                              # pc is not on an instruction boundary
    return depth, bp_off


def _function_start(image: ElfImage, vaddr: int) -> int | None:
    sym = image.function_at(vaddr)
    if sym is not None and sym.address <= vaddr < sym.address + max(sym.size, 1):
        return sym.address if vaddr - sym.address <= LEAF_SCAN else None
    if image.file.is_go:                              # stripped Go: find the stack check
        lo = max(vaddr - 24, 0)
        before = image.file.read(lo, vaddr - lo + 4)
        for pat, back in ((_GO_CHECK[0], 0), (_GO_CHECK[1], 8)):
            i = before.rfind(pat)
            if i >= 0 and lo + i - back >= 0:
                start = lo + i - back
                if back == 0 or image.file.read(start, 4) == b"\x4c\x8d\xa4\x24":
                    return start
    return None


# --- Go functions that move rsp to another stack ---------------------------------

def frame_pointer_spans(code: bytes, entry: int) -> list:
    """(start, end) address ranges of a function in which rbp holds its own
    frame (set up by the prologue, not yet restored): from the instruction
    after the set-up to the restoring `mov rbp, [rsp+N]`/`pop rbp` included,
    and again after the `ret` that follows one (code placed after it, a
    slow path, still runs in the frame)."""
    spans, start, restored = [], None, False
    end = entry
    for addr, size, mnem, ops in _lite(code, entry):
        end = addr + size
        if start is None and not restored:
            if _sets_up_frame(mnem, ops):
                start = end
        elif start is not None:
            if (mnem == "pop" and ops == "rbp") or (
                    mnem == "mov" and ops.startswith("rbp, qword ptr [rsp")):
                spans.append((start, end))
                start, restored = None, True
        elif mnem == "ret":            # restored: the frame is back after the ret
            start, restored = end, False
    if start is not None and end > start:
        spans.append((start, end))
    return spans
