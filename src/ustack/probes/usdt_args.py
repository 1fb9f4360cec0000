"""A USDT argument spec (objfile.stapsdt: `-8@%rdi`, `4@-12(%rbp)`,
`-4@$5`, `8@16(%rsp)`, `1@%al`) as a uprobe fetch-arg the kernel and
capture/bpf_fetchargs.py take ('%di', '-12(%bp)', '\\5') with its type: the
size in bytes, negative for a signed value, as <sys/sdt.h> writes it. A
global (`-4@gval(%rip)`, `8@16+arr(%rip)`) is read at its place in the file
(`@+OFFSET`), given a function that finds a symbol there."""
from __future__ import annotations

import re

from ..model import UstackError

_SPEC = re.compile(r"(?:(-?)([1248])@)?(.+)")
_MEMORY = re.compile(r"([+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+))?\((%[a-z0-9]+)\)")
# a symbol relative to the instruction pointer: gcc's spelling of a global
_GLOBAL = re.compile(r"(?:([+-]?(?:0[xX][0-9a-fA-F]+|[0-9]+))\+)?([A-Za-z_.$][A-Za-z0-9_.$@]*)"
                     r"([+-](?:0[xX][0-9a-fA-F]+|[0-9]+))?\(%rip\)")
_CONSTANT = re.compile(r"\$(-?(?:0[xX][0-9a-fA-F]+|[0-9]+))")
# x86-64 register names of every size -> the names uprobe_events takes
_REGS = {}
for _r in ("ax", "bx", "cx", "dx"):
    _REGS.update({"r" + _r: _r, "e" + _r: _r, _r: _r, _r[0] + "l": _r})
for _r in ("si", "di", "bp", "sp"):
    _REGS.update({"r" + _r: _r, "e" + _r: _r, _r: _r, _r + "l": _r})
for _n in range(8, 16):
    _REGS.update({f"r{_n}{s}": f"r{_n}" for s in ("", "d", "w", "b")})
_REGS.update(rip="ip", eip="ip")
# the second byte of ax..dx: bits 8..15 of the register
_HIGH = {"ah": "ax", "bh": "bx", "ch": "cx", "dh": "dx"}


def usdt_fetch(spec: str, probe: str, global_at=None) -> tuple:
    """(fetch, kernel type) of one argument spec of the probe named `probe`;
    `global_at(symbol)`: the @+OFFSET that reaches a global, None if unknown."""
    m = _SPEC.fullmatch(spec)
    operand = m.group(3) if m else ""
    signed, size = (m.group(1), int(m.group(2))) if m and m.group(2) else ("", 8)
    typ = f"{'s' if signed else 'u'}{8 * size}"
    if operand.startswith("%"):
        name = operand[1:]
        if name in _HIGH:
            return f"%{_HIGH[name]}", "b8@8/64"
        if name in _REGS:
            return f"%{_REGS[name]}", typ
    if _CONSTANT.fullmatch(operand):
        return "\\" + str(int(_CONSTANT.fullmatch(operand).group(1), 0)), typ
    glob = _GLOBAL.fullmatch(operand)
    if glob and global_at is not None:
        at = global_at(glob.group(2))
        if at is None:
            raise UstackError(f"USDT probe {probe}: its argument '{spec}' reads "
                              f"{glob.group(2)}, which the file's symbols do not name")
        off = int(glob.group(1) or "0", 0) + int(glob.group(3) or "0", 0)
        return f"@+0x{at + off:x}", typ
    mem = _MEMORY.fullmatch(operand)
    if mem and mem.group(2)[1:] in _REGS and _REGS[mem.group(2)[1:]] != "ip":
        off = int(mem.group(1) or "0", 0)
        return f"{off:+d}(%{_REGS[mem.group(2)[1:]]})", typ
    raise UstackError(f"USDT probe {probe}: cannot fetch its argument '{spec}' "
                      "(ustack reads registers, constants, globals and memory at a "
                      "register plus an offset)")
