"""The instructions control flow reaches from a function's start.

A linear sweep from a start decodes whatever bytes follow, so data placed
in the code (a jump over it, a literal pool) shifts it off the true
instructions: it then calls the middle of an instruction a start, and a
true start the middle of one. Here decoding follows the code as the CPU
would: from the start, each path goes on until a ret or jmp ends it, and
every direct jump, branch or call inside the function starts another path.
A switch's indirect jump reaches the targets its table lists (gcc's
`lea TABLE(%rip)` + 32-bit offsets, or absolute 64-bit entries), read from
the file, as many entries as the bound check before it (`cmp idx, N; ja`)
allows; those are decoded after every path direct control flow gives,
and one that would cut into an instruction already decoded is dropped.
A jump through a table whose bound is not seen reaches nothing.

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
_PIC_ENTRY = re.compile(r"^dword ptr \[(\w+) \+ (\w+)\*4\]$")
_MAX_TABLE = 4096           # entries read from one switch table
# the unsigned bound checks before a table jump, and what they add to N of
# `cmp idx, N` for the number of entries
_BOUND_CHECKS = {"ja": 1, "jbe": 1, "jae": 0, "jb": 0}


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
        at = sure.pop() if sure else tables.pop(0)
        _path(code, start, end, at, insns, owner, sure, tables, disk)
    return Flow(start, end, insns)


def _path(code, start, end, at, insns, owner, sure, tables, disk) -> None:
    """Decode one path from `at` until it ends or meets decoded code."""
    if not start <= at < end or owner[at - start]:
        return              # outside, done, or inside an instruction (a bad table entry)
    switch = _Switch()
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
                tables.extend(_entries(disk, switch.table(ops), start, end))
        switch.see(addr + size, base, ops)
        if base in _ENDS_PATH or base.startswith("ret"):
            return
        if addr + size >= end:
            return


class _Switch:
    """gcc's switch on one path: `cmp idx, N; ja default` bounds the index,
    then `lea T(%rip), b; movslq (b,idx,4), r; add b', r; jmp *r` (PIC,
    entries relative to b') or `jmp *T(,idx,8)` (absolute entries). Each
    register's meaning is forgotten once something else writes it."""

    def __init__(self):
        self.rip = {}           # register -> address a rip-relative lea put in it
        self.limit = None       # (register, N) of the last `cmp reg, N`
        self.bound = None       # (register, entries) once its ja/jae followed
        self.loaded = {}        # register -> (table, entries): an entry, relative
        self.jumps = {}         # register -> (table, entries, base): a target

    def see(self, after: int, mnem: str, ops: str) -> None:
        dest, _, src = ops.partition(", ")
        if mnem == "cmp":
            n = _immediate(src)
            self.limit = (_canon(dest), n) if n is not None else None
            return
        if mnem in _BOUND_CHECKS:
            if self.limit is not None:
                self.bound = (self.limit[0], self.limit[1] + _BOUND_CHECKS[mnem])
            return
        if not src or mnem in ("test", "push") or "[" in dest or (
                mnem in _EXTENDS and _canon(dest) == _canon(src)):
            return          # movzx eax, al after `cmp al, N`: the same bounded index
        reg = _canon(dest)
        kept = {}
        m = _RIP_LEA.match(ops) if mnem == "lea" else None
        if m:
            disp = int(m.group(3), 0)
            kept["rip"] = after + (disp if m.group(2) == "+" else -disp)
        t = _PIC_ENTRY.search(src) if mnem == "movsxd" else None
        if t and self.bound and self.bound[0] == _canon(t.group(2)) and \
                _canon(t.group(1)) in self.rip:
            kept["loaded"] = (self.rip[_canon(t.group(1))], self.bound[1])
        if mnem == "add" and reg in self.loaded and _canon(src) in self.rip:
            kept["jumps"] = (*self.loaded[reg], self.rip[_canon(src)])
        for name in ("rip", "loaded", "jumps"):
            table = getattr(self, name)
            table.pop(reg, None)
            if name in kept:
                table[reg] = kept[name]
        if self.bound and self.bound[0] == reg:
            self.bound = None
        if self.limit and self.limit[0] == reg:
            self.limit = None

    def table(self, ops: str):
        """(table, entries, entry size, base) for `jmp ops`, None if unknown."""
        m = _ABS_TABLE.search(ops)
        if m and self.bound and self.bound[0] == _canon(m.group(1)):
            return int(m.group(2), 0), self.bound[1], 8, 0
        found = self.jumps.get(_canon(ops))
        return (found[0], found[1], 4, found[2]) if found else None


def _canon(reg: str) -> str:
    """A register's 64-bit name: eax, ax, al -> rax; r9d -> r9."""
    if reg in _LEGACY:
        return _LEGACY[reg]
    if len(reg) == 3 and reg[0] == "e":
        return "r" + reg[1:]
    if reg[:1] == "r" and reg[-1:] in "dwb" and reg[1:-1].isdigit():
        return reg[:-1]
    return reg


_EXTENDS = ("mov", "movzx", "movsxd", "movsx")
_LEGACY = {f"{x}{s}": f"r{x}x" for x in "abcd" for s in "lx"}
_LEGACY.update({n: "r" + base for base in ("si", "di", "bp", "sp")
                for n in (base, base + "l")})


def _immediate(ops: str):
    try:
        return int(ops, 0)
    except ValueError:
        return None


def _entries(disk, table, start: int, end: int) -> list:
    """The targets a switch table lists inside [start, end)."""
    if table is None:
        return []
    at, count, width, base = table
    data = disk.read(at, width * min(count, _MAX_TABLE))
    fmt = "<Q" if width == 8 else "<i"
    out = []
    for (value,) in struct.iter_unpack(fmt, data[:len(data) - len(data) % width]):
        target = (base + value) & 0xffffffffffffffff
        if start <= target < end:
            out.append(target)
    return out
