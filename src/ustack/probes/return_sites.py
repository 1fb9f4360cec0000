"""Function returns without uretprobes: the RET instructions of a function,
found by disassembly, each a place for a plain uprobe.

A uretprobe replaces the return address on the stack with a trampoline's;
Go copies goroutine stacks and checks the return addresses it finds there,
so a uretprobe crashes a Go program. A uprobe on each RET leaves the stack
alone. What a linear sweep of the function's bytes (its symbol's or
.gopclntab's bounds) finds:
- `ret` (any form): a return site;
- `jmp` to an address outside the function: a tail call; the function's
  call ends there, but the callee's RET returns to our caller. These are
  `tail_jumps`: a latency run ends the call's timing there without timing
  it (it would be the time until the jump, not until the return);
- indirect jumps (`jmp rax`: switch tables) stay inside the function.
Go functions that can grow their stack start with a check that calls
runtime.morestack and then jumps back to the function's first instruction:
a probe there fires twice for one call whose stack grew. `entry_site`
gives the first instruction after that check instead."""
from __future__ import annotations


from ..model import UprobeProbe, UstackError
from ..objfile import prologue
from ..objfile.elf import ElfImage, Symbol
from ..values import replace, value

_GO_CHECK_SCAN = 32          # bytes in which Go's stack check ends


@value
class ReturnSites:
    """Where a function's calls end, as ELF virtual addresses."""
    rets: tuple              # RET instructions
    tail_jumps: tuple        # jumps out of the function (tail calls)


def return_sites(image: ElfImage, sym: Symbol) -> ReturnSites:
    """The RETs and tail-call jumps of `sym` (a function with a size); a
    part gcc split off (`f.cold`) counts as the function's own code."""
    if sym.size <= 0:
        raise UstackError(f"{sym.name} has no known size: its return instructions "
                          "cannot be found")
    parts = [sym]
    rets, jumps = [], []
    for part in parts:
        for kind, at, target in _exits(image, part):
            owner = image.symbols.lookup(target) if target is not None else None
            if kind == "ret":
                rets.append(at)
            elif any(p.address <= target < p.address + p.size for p in parts):
                continue                    # from a split part back home
            elif owner is not None and owner.address == target and \
                    owner.name.startswith(sym.name + ".cold"):
                parts.append(owner)
            else:
                jumps.append(at)
    return ReturnSites(tuple(sorted(rets)), tuple(sorted(jumps)))


def _exits(image: ElfImage, sym: Symbol):
    """("ret", address, None) and ("jmp", address, target) of the direct
    jumps leaving `sym`, by a linear sweep of its bytes."""
    end = sym.address + sym.size
    code = image.file.read(sym.address, sym.size)
    reached = sym.address
    for addr, size, mnem, ops in prologue.decode(code, sym.address):
        reached = addr + size
        if mnem.startswith(("ret", "rep")) and mnem.endswith("ret"):
            yield "ret", addr, None
        elif mnem == "jmp":
            try:
                target = int(ops, 0)
            except ValueError:
                continue                    # indirect: a switch table's, inside
            if not sym.address <= target < end:
                yield "jmp", addr, target
    rest = code[reached - sym.address:]
    if any(b not in (0x00, 0xCC, 0x90) for b in rest):
        raise UstackError(f"cannot disassemble all of {sym.name} (stopped at "
                          f"+0x{reached - sym.address:x} of 0x{sym.size:x}): refusing "
                          "return probes that could miss a return")


def entry_site(image: ElfImage, sym: Symbol) -> int:
    """Where an entry probe sees each call begin once: the function's
    first instruction, or in Go after the stack-growth check
    (`cmp 0x10(%r14),%rsp; jbe more` or its r12 forms for big frames),
    which runs again from the start once runtime.morestack grew the stack."""
    if not image.file.is_go:
        return sym.address
    code = image.file.read(sym.address, min(sym.size, _GO_CHECK_SCAN))
    after = sym.address
    for addr, size, mnem, ops in prologue.decode(code, sym.address):
        if mnem.startswith("j") and mnem != "jmp":
            after = addr + size             # the check's (last) branch
        elif not ("r12" in ops or "[r14 + 0x10]" in ops):
            break                           # the body starts
    return after if after < sym.address + sym.size else sym.address


def site_probe(entry: UprobeProbe, image: ElfImage, at: int, label: str) -> UprobeProbe:
    """A plain uprobe at `at`, in the function of `entry`, named `label`:
    at a RET (or a tail call's jmp) [sp] holds the return address, so the
    frame-pointer walk's missing caller is the word at slot 0. The site
    is proven an instruction start from the file, as every probe is."""
    from .boundary import prove
    offset = at - (entry.address - entry.symbol_offset)
    proof = prove(image, entry.path, at, f"{entry.symbol}+0x{offset:x}", entry.path)
    return replace(
        entry, spec=replace(entry.spec, kind="uprobe", offset=0),
        file_offset=proof.file_offset, address=at, symbol_offset=offset,
        return_address_slot=0, label=label)


def return_probes(entry: UprobeProbe, image: ElfImage, label: str = "") -> tuple:
    """(probes on each RET of the function `entry` is in, probes on its
    tail-call jumps): plain uprobes labelled `label` (default: the entry's
    label with uretprobe for uprobe). The interface for anyone who needs
    function returns where a uretprobe would harm (Go)."""
    sym = image.symbols.lookup(entry.address)
    if sym is None or entry.symbol is None:
        raise UstackError(f"{entry.label}: return probes need a function with a "
                          "symbol and a size")
    sites = return_sites(image, sym)
    if not sites.rets and not sites.tail_jumps:
        raise UstackError(f"{sym.name} has no return instruction (it never returns)")
    label = label or entry.label.replace("uprobe:", "uretprobe:", 1)
    return (tuple(site_probe(entry, image, at, label) for at in sites.rets),
            tuple(site_probe(entry, image, at, label) for at in sites.tail_jumps))
