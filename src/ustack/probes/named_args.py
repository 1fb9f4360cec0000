"""Arguments by name: 'uprobe:PATH:FUNC n len buf:string' -> the kernel's
fetch-args ('n=%di:s32 len=%si:u64 buf=+0(%dx):string'), from the DWARF of
the function at the probe (objfile.dwarf_params), with how each value
prints (signed, unsigned, bool, char, pointer in hex, string). Also types a
bare `$retval` from the function's return type.

A location becomes a fetch-arg when it is a register (DW_OP_reg*), a word
in memory at a register plus an offset (DW_OP_breg*), or a stack slot
relative to the frame base (DW_OP_fbreg): the frame base of GCC, clang
and Go code is the CFA, which at a function's entry is %sp + 8 and, a few
instructions later, %sp + 8 × (the return address's slot + 1), known where
the prologue is straight-line code (objfile.prologue). A location list
gives the entry covering the probe's address. Everything else (a value
known only as it was at entry, pieces, floating-point registers) is
refused with the reason: a probe must show what gdb would, or nothing."""
from __future__ import annotations

import re

from ..objfile.demangle import demangle
from ..objfile.dwarf_params import CType, DamagedDwarf, DwarfParams, FunctionInfo
from .fetchargs import GO_ARGS, SYSV_ARGS, NamedArgError, display_kinds  # noqa: F401

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# DWARF register numbers of x86-64 (System V psABI, figure 3.36) -> the
# names uprobe_events takes
_REGS = ("ax", "dx", "cx", "bx", "si", "di", "bp", "sp",
         "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "ip")
_XMM = range(17, 33)
_SIZES = (1, 2, 4, 8)


def is_name(fetch: str) -> bool:
    """Whether a fetch-arg is a parameter's name, not a kernel fetch
    (those all start with %, $, @, +, - or \\)."""
    return bool(_IDENT.fullmatch(fetch))


def resolve_args(args: tuple, image, shown: str, func: str, where: str, vaddr: int,
                 kind: str, ra_slot: int | None, fp_cfa: int | None = None) -> tuple:
    """(args in the kernel's syntax, ((name, display kind), …)) for the
    user's (name, fetch, type) triples at vaddr in `func` (shown as
    `where`). ra_slot: the return address's word index from %sp at vaddr
    (None: unknown), which places the CFA; fp_cfa: N where the CFA is
    %bp + N there (a frame-pointer frame), else None."""
    kinds = display_kinds(args)
    named = [a for a in args if is_name(a[1])]
    typed_ret = [a for a in args if a[1] == "$retval"]
    if not named and not typed_ret:
        return args, tuple(kinds.items())
    func = demangle(func)                 # messages name C++ functions as people do
    if named and kind == "uretprobe":
        raise NamedArgError(f"cannot fetch {named[0][1]} at the return of {func}: its "
                            "parameters are gone by then; fetch them with a uprobe on "
                            "its entry (a uretprobe has $retval)")
    regs = GO_ARGS if image.is_go else SYSV_ARGS
    abi = "Go's register ABI" if image.is_go else "the C ABI"
    try:
        info = _function(image, vaddr)
    except DamagedDwarf as e:
        if named:
            raise NamedArgError(f"cannot fetch {named[0][1]}: {e}; fetch by register "
                                f"instead: $arg1…$arg{len(regs)} in {abi}") from None
        info = None                       # $retval alone: untyped, as without DWARF
    if named and info is None:
        how = ("go build leaves it out with -ldflags=-s or -w" if image.is_go
               else "build it with -g or install its debug file")
        raise NamedArgError(
            f"cannot fetch {named[0][1]}: {shown} has no DWARF for {func} ({how}); "
            f"fetch by register instead: $arg1…$arg{len(regs)} in {abi}")
    out = []
    for name, fetch, typ in args:
        if is_name(fetch):
            param = _param(info, fetch, func)
            fetch, typ, kinds[name] = _param_fetch(param, typ, info, vaddr, where,
                                                   ra_slot, fp_cfa)
        elif fetch == "$retval":
            fetch, typ, kinds[name] = _retval_fetch(info, typ, func, kinds[name])
        out.append((name, fetch, typ))
    return tuple(out), tuple(kinds.items())


def _function(image, vaddr: int) -> FunctionInfo | None:
    params = DwarfParams.for_image(image)
    return params.function_at(vaddr) if params is not None else None


def _param(info: FunctionInfo, name: str, func: str):
    for p in info.params:
        if p.name == name and not p.output:
            return p
    names = [p.name for p in info.params if p.name and not p.output]
    have = f"its parameters: {', '.join(names)}" if names else "it has no parameters"
    raise NamedArgError(f"{func} has no parameter '{name}'; {have}")


def _param_fetch(param, typ: str, info: FunctionInfo, vaddr: int, where: str,
                 ra_slot: int | None, fp_cfa: int | None) -> tuple:
    """(fetch, kernel type, display kind) of one parameter at vaddr."""
    def cannot(why):
        raise NamedArgError(f"cannot fetch {param.name} at {where}: {why}")

    ctype = param.type
    if typ in ("string", "ustring"):
        if ctype.kind != "pointer":
            cannot(f"it is {ctype.name}, not a pointer: it cannot be read as a string")
        deref, typ, kind = "+0({})", typ, "str"
    elif typ:                   # the user's type, as for a register
        deref, kind = "{}", display_kinds((("", "", typ),))[""]
    elif ctype.kind == "pointer" and ctype.pointee == "char":
        deref, typ, kind = "+0({})", "string", "str"
    else:
        deref, (typ, kind) = "{}", _kernel_type(ctype, cannot)
    ops = param.ops_at(vaddr)
    if ops is None:
        cannot("it is optimized out there (no DWARF location covers "
               f"0x{vaddr:x})" if param.locations else "DWARF gives it no location")
    fetch = _location(ops, info.frame_base, vaddr == info.low, ra_slot, fp_cfa, cannot)
    return deref.format(fetch), typ, kind


def _location(ops: tuple, frame_base: tuple, at_entry: bool, ra_slot, fp_cfa,
              cannot) -> str:
    """A location expression as a kernel fetch: a register, or memory at
    an offset from one."""
    names = [op for op, _args in ops]
    if "DW_OP_entry_value" in names or "DW_OP_GNU_entry_value" in names:
        cannot("DWARF knows it there only as the value it had at the function's entry "
               "(DW_OP_entry_value), which the registers no longer hold; probe the "
               "function's entry")
    if "DW_OP_piece" in names or "DW_OP_bit_piece" in names:
        cannot("it is split into pieces (DW_OP_piece), which a fetch-arg cannot join")
    if len(ops) == 2 and names[1] == "DW_OP_stack_value":
        value = _constant(ops[0])
        if value is not None:
            return f"\\{value}"
    if len(ops) != 1:
        cannot(f"its DWARF location ({' '.join(names)}) is more than a register or "
               "a stack slot")
    op, args = ops[0]
    reg = _register(op, args, "DW_OP_reg", "DW_OP_regx")
    if reg is not None:
        return _reg_name(reg, cannot)
    reg = _register(op, args, "DW_OP_breg", "DW_OP_bregx")
    if reg is not None:
        return f"{args[-1]:+d}({_reg_name(reg, cannot)})"
    if op == "DW_OP_fbreg":
        base, off = _frame_base(frame_base, at_entry, ra_slot, fp_cfa, cannot)
        if at_entry and base == "%sp" and off + args[0] < 0:
            # below the stack pointer at the entry: a slot the prologue
            # fills later (code built without optimization), not yet written
            cannot("DWARF keeps it in a stack slot that the function's prologue "
                   "writes after the entry (code built without optimization), so "
                   "at the entry it holds no value yet; probe past the prologue "
                   "(FUNC+OFFSET) or fetch the register it arrives in ($arg1…)")
        return f"{off + args[0]:+d}({base})"
    cannot(f"its DWARF location ({op}) is not a register or a stack slot")


def _frame_base(frame_base: tuple, at_entry: bool, ra_slot, fp_cfa, cannot) -> tuple:
    """(register, offset) that DW_OP_fbreg counts from."""
    if len(frame_base) == 1:
        op, args = frame_base[0]
        if op == "DW_OP_call_frame_cfa":
            if ra_slot is None and fp_cfa is not None:
                return "%bp", fp_cfa
            if ra_slot is None:
                cannot("its stack slot is relative to the frame (CFA), which ustack "
                       "places only at the function's entry and in straight-line "
                       "prologue code; probe the function's entry")
            return "%sp", 8 * (ra_slot + 1)
        reg = _register(op, args, "DW_OP_breg", "DW_OP_bregx")
        if reg is not None:
            return _reg_name(reg, cannot), args[-1]
        reg = _register(op, args, "DW_OP_reg", "DW_OP_regx")
        # a frame pointer as the base (clang -O0): it holds this frame once
        # the prologue set it up, i.e. past the entry where no slot is known
        if reg is not None and not at_entry and ra_slot is None:
            return _reg_name(reg, cannot), 0
    cannot("the function's frame base is not one ustack can place")


def _register(op: str, args: tuple, prefix: str, extended: str) -> int | None:
    if op == extended:
        return args[0]
    tail = op[len(prefix):]
    if op.startswith(prefix) and tail.isdigit():
        return int(tail)
    return None


def _reg_name(reg: int, cannot) -> str:
    if reg in _XMM:
        cannot(f"it is in register xmm{reg - 17}, which uprobe fetch-args cannot read")
    if reg >= len(_REGS):
        cannot(f"it is in DWARF register {reg}, which uprobe fetch-args cannot read")
    return "%" + _REGS[reg]


def _constant(op) -> int | None:
    name, args = op
    if name.startswith("DW_OP_lit") and name[9:].isdigit():
        return int(name[9:])
    if name in ("DW_OP_constu", "DW_OP_consts") or (
            name[:-2] in ("DW_OP_const1", "DW_OP_const2", "DW_OP_const4", "DW_OP_const8")
            and name[-1] in "us"):
        return args[0]
    return None


def _kernel_type(ctype: CType, cannot) -> tuple:
    """(kernel type, display kind) of a value of C type `ctype`."""
    k, size = ctype.kind, ctype.size
    if k == "struct":
        cannot(f"it is a {ctype.name} passed by value ({size} bytes); fetch-args "
               "read scalars, pointers and strings")
    if k == "float":
        cannot(f"it is a floating-point {ctype.name}, which uprobe fetch-args cannot show")
    if k == "pointer":
        return "x64", "hex"
    if size not in _SIZES:
        cannot(f"its type {ctype.name} is {size} bytes, not 1, 2, 4 or 8")
    bits = 8 * size
    if k == "bool":
        return f"u{bits}", "bool"
    if k == "char":
        return f"u{bits}", "char"
    if k in ("signed", "enum"):
        return f"s{bits}", "dec"
    if k == "unsigned":
        return f"u{bits}", "dec"
    return f"x{bits}", "hex"


def _retval_fetch(info: FunctionInfo | None, typ: str, func: str, kind: str) -> tuple:
    """$retval typed from the function's return type when the user gave no
    type; `$retval:string` reads the string the returned pointer points to."""
    if typ in ("string", "ustring"):
        return "+0($retval)", typ, "str"
    if typ or info is None or info.returns is None or info.returns.kind == "void":
        return "$retval", typ, kind

    def cannot(why):
        raise NamedArgError(f"cannot fetch $retval of {func}: {why}")
    if info.returns.kind == "float":
        cannot(f"it returns a floating-point {info.returns.name} in xmm0, which uprobe "
               "fetch-args cannot read")
    if info.returns.kind == "struct":
        cannot(f"it returns a {info.returns.name} by value; fetch-args read scalars "
               "and pointers")
    return ("$retval", *_kernel_type(info.returns, cannot))
