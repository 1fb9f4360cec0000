"""The instructions control flow reaches from a function's start.

A linear sweep from a start decodes whatever bytes follow, so data placed
in the code (a jump over it, a literal pool) shifts it off the true
instructions: it then calls the middle of an instruction a start, and a
true start the middle of one. Here decoding follows the code as the CPU
would: from the start, each path goes on until a ret or jmp ends it, and
every direct jump, branch or call inside the function starts another path.
A switch's indirect jump reaches the targets its table lists (gcc's
`lea TABLE(%rip)` + 32-bit offsets, or absolute 64-bit entries), read from
the file; those are decoded after every path direct control flow gives,
and one that would cut into an instruction already decoded is dropped.

One function is decoded once per run (a glob of thousands of entry probes
decodes nothing: an entry is its own start)."""
from __future__ import annotations

import functools
import re
import struct

from ..objfile import prologue

_ENDS_PATH = ("ret", "jmp", "ud2", "hlt", "int3", "retf", "iretq", "sysret")
_RIP_LEA = re.compile(r"^(\w+), \[rip ([+-]) (0x[0-9a-f]+|\d+)\]$")
_ABS_TABLE = re.compile(r"\[(\w+)\*8 \+ (0x[0-9a-f]+)\]$")
_MAX_TABLE = 4096           # entries read from one switch table


class Flow:
    """What decoding from `start` over [start, end) reached: `insns`
    {address: (size, mnemonic, operands)}."""

    def __init__(self, start: int, end: int, insns: dict):
        self.start, self.end, self.insns = start, end, insns

    def covering(self, vaddr: int):
        """(address, size, mnemonic, operands) of the reached instruction
        vaddr is inside (not at its first byte), None if there is none."""
        for at in range(vaddr - 1, max(self.start, vaddr - 15) - 1, -1):
            found = self.insns.get(at)
            if found is not None:
                return (at, *found) if at + found[0] > vaddr else None
        return None

    def furthest(self) -> int:
        """The end of the last instruction reached (start when none)."""
        return max((a + s for a, (s, _m, _o) in self.insns.items()), default=self.start)


@functools.lru_cache(maxsize=512)
def reach(disk, start: int, end: int) -> Flow:
    """The instructions reached from `start` in [start, end) of the file
    `disk` (OnDisk): recursive descent, see the module's text."""
    code = disk.code(start, end + 15)
    insns: dict = {}
    owner = bytearray(len(code))      # 1: an instruction's first byte, 2: inside one
    sure, tables = [start], []
    while sure or tables:
        at = sure.pop() if sure else tables.pop()
        _path(code, start, end, at, insns, owner, sure, tables, disk)
    return Flow(start, end, insns)


def _path(code, start, end, at, insns, owner, sure, tables, disk) -> None:
    """Decode one path from `at` until it ends or meets decoded code."""
    if not start <= at < end or owner[at - start]:
        return              # outside, done, or inside an instruction (a bad table entry)
    lea = None              # the last rip-relative lea: a switch table's base
    for addr, size, mnem, ops in prologue.decode(code[at - start:], at):
        i = addr - start
        if owner[i] or any(owner[i + 1:i + size]):
            return          # joined a decoded path (or would cut into one)
        insns[addr] = (size, mnem, ops)
        owner[i] = 1
        owner[i + 1:i + size] = b"\x02" * (size - 1)
        base = mnem.split()[-1] if mnem else mnem     # "notrack jmp", "bnd jmp"
        target = _immediate(ops)
        if base.startswith("j") or base.startswith("loop") or base == "call":
            if target is not None:
                sure.append(target)
            elif base == "jmp":
                tables.extend(_table_targets(disk, ops, lea, start, end))
        m = _RIP_LEA.match(ops) if base == "lea" else None
        if m:
            disp = int(m.group(3), 0)
            lea = addr + size + (disp if m.group(2) == "+" else -disp)
        if base in _ENDS_PATH or base.startswith("ret"):
            return
        if addr + size >= end:
            return


def _immediate(ops: str):
    try:
        return int(ops, 0)
    except ValueError:
        return None


def _table_targets(disk, ops: str, lea, start: int, end: int) -> list:
    """The targets of a switch's indirect jump, from its table: entries
    are read while they land inside the function."""
    m = _ABS_TABLE.search(ops)
    if m:
        return _entries(disk, int(m.group(2), 0), 8, "<Q", 0, start, end)
    if lea is not None and re.fullmatch(r"\w+", ops):        # jmp reg: PIC table
        return _entries(disk, lea, 4, "<i", lea, start, end)
    return []


def _entries(disk, table: int, width: int, fmt: str, base: int, start: int, end: int) -> list:
    data = disk.read(table, width * _MAX_TABLE)
    out = []
    for (value,) in struct.iter_unpack(fmt, data[:len(data) - len(data) % width]):
        target = (base + value) & 0xffffffffffffffff
        if not start <= target < end:
            break
        out.append(target)
    return out
