"""Proof that a uprobe address is the start of an instruction.

A uprobe in the middle of an instruction replaces a byte of it with int3:
the target then runs other instructions than its own (wrong results,
SIGILL, SIGSEGV). x86 code cannot be decoded backwards, so an address is
accepted only when decoding forward from a known function start lands on it
exactly. The starts trusted are those the file on disk states: a function
symbol of the file or of its debug file (the same build-id), the first
address of an FDE of its CFI (.eh_frame survives `strip -s`), a Go
function's entry in .gopclntab. A start the image cache names is only a
candidate: it counts when the file's own symbol table has it.

Where a symbol and an FDE both cover the address, the address must be an
instruction start in the walk from each. Two true starts of straight code
give the same instruction starts past the later one, so honest ones always
agree; a symbol or FDE placed inside an instruction (a crafted .symtab)
gives a walk the other contradicts, and then the probe is refused."""
from __future__ import annotations

from ..model import UstackError
from ..objfile import prologue
from ..objfile.on_disk import OnDisk
from . import flow
from ..values import value

UNSAFE_FLAG = "--unsafe-address"


class NotABoundary(UstackError):
    """A walk from a trusted start finds the address inside an instruction."""


class NotProven(UstackError):
    """No walk from a trusted start reaches the address: it may be inside an
    instruction. --unsafe-address lets such a probe be placed anyway."""


@value
class Proof:
    """Where a proven probe goes: the file offset (from the file's own
    headers) and the named function start (a symbol's or Go's) a walk came
    from, with that function's bytes from the file, for the return-address
    slot; start is None when there is none."""
    file_offset: int
    start: int | None = None
    code: bytes = b""
    starts: tuple = ()        # every trusted start that covers the address


@value
class _Start:
    address: int
    name: str | None          # the function's name (symbol, Go), None for an FDE
    end: int                  # where its function ends, as far as known
    what: str                 # "symbol", "CFI", "Go pclntab" (for messages)


def prove(image, host: str, vaddr: int, where: str, shown: str, kind: str = "uprobe",
          sym=None, debug=None, unsafe: bool = False) -> Proof:
    """A Proof that vaddr of the ELF file `host` (ElfImage `image`) is an
    instruction start, or an error that says why not, naming the probe as
    the user gave it (`kind`:`shown`:`where`). `sym`: the function
    the caller found at vaddr (the image cache's or the debug file's, a
    candidate only); `debug`: the debug file's ElfImage. With `unsafe`, an
    address no walk reaches is accepted; one a walk finds inside an
    instruction never is."""
    disk = OnDisk.of(host)
    off = disk.file_offset(vaddr)
    if off is None:
        raise UstackError(f"{where} is not in the code of {shown}")
    label = f"{kind}:{shown}:{where}"
    starts = _trusted_starts(image, disk, vaddr, sym, debug)
    if not starts:
        if unsafe:
            return Proof(off)
        raise NotProven(
            f"{label}: no function start is known at or before 0x{vaddr:x} (no "
            "symbol, CFI or Go table of the file covers it), so ustack cannot "
            f"prove it is an instruction boundary; add {UNSAFE_FLAG} to probe it anyway")
    starts = _agreeing(disk, starts, where, shown)
    for start in starts:
        _walk(disk, start, vaddr, where, shown, label, unsafe)
    best = starts[0]                    # a symbol first: the slot counts from it
    known = tuple(s.address for s in starts)
    if best.name is None:               # an FDE's start may be no call's target (_start)
        return Proof(off, starts=known)
    code = disk.code(best.address, max(best.end, vaddr + 1))
    return Proof(off, best.address, code, known)


def _trusted_starts(image, disk: OnDisk, vaddr: int, sym, debug) -> list:
    """The starts the file states for the function around vaddr: a symbol
    (checked against the file's tables), the FDE's, Go's; nearest first."""
    found = []
    for candidate, where in ((sym, None), (image.symbols.lookup(vaddr), None),
                             (debug.symbols.lookup(vaddr) if debug is not None else None, debug)):
        if candidate is None or not candidate.address <= vaddr < (
                candidate.address + max(candidate.size, 1)):
            continue
        if _in_symbol_table(disk, candidate.address, where):
            found.append(_Start(candidate.address, candidate.name,
                                candidate.address + candidate.size, "symbol"))
            break
    cfi = disk.fde(vaddr)
    if cfi is not None:
        found.append(_Start(cfi[0], None, cfi[1], "CFI"))
    if image.file.is_go:
        go = _go_entry(image, disk, vaddr)
        if go is not None:
            found.append(_Start(go[0], go[2], go[1], "Go pclntab"))
    unique = {}
    for start in found:
        unique.setdefault(start.address, start)
    return list(unique.values())


def _in_symbol_table(disk: OnDisk, address: int, debug) -> bool:
    """The file (or its debug file, when it has the same build-id on disk)
    has a function symbol at `address`."""
    if disk.has_function(address):
        return True
    if debug is None:
        return False
    other = OnDisk.of(debug.path)
    return bool(disk.build_id) and other.build_id == disk.build_id \
        and other.has_function(address)


def _go_entry(image, disk: OnDisk, vaddr: int) -> tuple | None:
    """(entry, end, name) of the Go function .gopclntab places vaddr in, when the
    image's view of the file is the file's (the table is read through it)."""
    from ..objfile.gopclntab import PclntabError, go_table
    sec = disk.sections.get(".gopclntab")       # (a PIE's is in .data.rel.ro)
    if image.file.sections.get(".gopclntab") != (sec and (sec.addr, sec.offset, sec.size)):
        return None
    if [(v, o, n) for v, o, n, _w in image.file.segments()] != [
            (v, o, n) for v, o, n, _f in disk.loads]:
        return None
    try:
        table = go_table(image)
    except PclntabError:
        return None
    func = table.find(vaddr) if table is not None else None
    return (func.entry, func.end, func.name) if func is not None else None


def _walk(disk: OnDisk, start: _Start, vaddr: int, where: str, shown: str,
          label: str, unsafe: bool) -> None:
    """Follow control flow from `start` (probes/flow.py): vaddr must be the
    first byte of an instruction it reaches."""
    if start.address == vaddr:
        return                  # (a function entry: no decoder to load)
    found = flow.reach(disk, start.address, max(start.end, vaddr + 1))
    if vaddr in found.insns:
        return
    inside = found.covering(vaddr)
    if inside is not None:
        at, _size, mnem, ops = inside
        raise NotABoundary(f"{where} in {shown} is not on an instruction "
                           f"boundary (inside '{mnem} {ops}' at {_named(start, at)})")
    if unsafe:
        return
    raise NotProven(
        f"{label}: no path of the code from the {start.what} start 0x{start.address:x} "
        f"reaches 0x{vaddr:x} (data, or code reached only through a pointer), so "
        f"ustack cannot prove it is an instruction boundary; add {UNSAFE_FLAG} "
        "to probe it anyway")


def _named(start: _Start, at: int) -> str:
    return (f"{start.name}+0x{at - start.address:x}" if start.name
            else f"0x{at:x}, decoding from the {start.what} start 0x{start.address:x}")


def _agreeing(disk: OnDisk, starts: list, where: str, shown: str) -> list:
    """The starts without a CFI start that its neighbours contradict: one
    inside an instruction decoded from a symbol's start before it, or from
    the FDE before it (through the padding between them). A contradicted
    one is dropped; when it was the only start, the probe is refused."""
    kept = []
    for start in starts:
        why = None
        if start.what == "CFI" and all(s.address != start.address for s in starts
                                       if s is not start):
            why = _contradiction(disk, start.address, [
                s for s in starts if s is not start and s.address < start.address])
        if why is None:
            kept.append(start)
        elif len(starts) == 1:
            raise NotABoundary(f"{where} in {shown} is not proven: the CFI start "
                               f"0x{start.address:x} is not on an instruction "
                               f"boundary ({why}), so it is not trusted")
    return kept


def _contradiction(disk: OnDisk, at: int, before: list) -> str | None:
    """Why the start `at` cannot be a true one: the instruction that
    decoding from an earlier start (`before`, whose ranges cover it) finds
    it inside, or that a linear decode of the gap since the end of the FDE
    before it does (padding, in honest files: the previous function's end
    is an instruction boundary); None when nothing contradicts it."""
    for s in before:
        inside = flow.reach(disk, s.address, s.end).covering(at)
        if inside is not None:
            return f"inside '{inside[2]} {inside[3]}' at {_named(s, inside[0])}"
    prev = disk.fde_before(at)
    if prev is None:
        return None
    if prev[1] > at:                    # overlapping FDEs: decode the one before
        inside = flow.reach(disk, *prev).covering(at)
        return None if inside is None else (
            f"inside '{inside[2]} {inside[3]}' at 0x{inside[0]:x}, decoding from "
            f"the CFI start 0x{prev[0]:x}")
    gap = prev[1]
    code = disk.code(gap, at + 15)
    for addr, size, mnem, ops in prologue.decode(code, gap):
        if addr >= at:
            break
        if addr + size > at:
            if all(b in _FILL for b in code[addr - gap:at - gap]):
                return None     # zeros or int3 a linker filled the gap with
            return f"inside '{mnem} {ops}' at 0x{addr:x}, decoding from the end " \
                   f"0x{gap:x} of the function before it"
    return None


_FILL = frozenset((0x00, 0xCC))
