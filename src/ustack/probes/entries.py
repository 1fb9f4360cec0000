"""Where a return probe may go: only on an entry that calls reach.

A uretprobe (and latency's return timing, which places one) replaces the
word at [sp] when it fires, taking it for the return address. That holds
where a `call` lands. gcc also splits a function's unlikely paths off into
a fragment (`work.cold`) that the function reaches by a jump, after its
pushes: [sp] there is a saved register, and replacing it silently changes
the program's results. A `.part.N` or `.constprop.N` clone is a function
that is called, and is fine.

What counts as evidence, from the file itself:
- the function's symbol, unless its name is a split fragment's (`.cold`);
- the CFI: an FDE that begins at the address has, at its first row, the
  return address at sp (CFA = rsp + 8, return address at CFA - 8); an FDE
  that says otherwise refuses the address whatever the symbol says;
- in code no symbol names (a stripped binary), only that CFI.

A function called may still keep its return address to return a second
time: setjmp and getcontext read it from [sp] and store it, and longjmp
or setcontext later return to it. A return probe has put its trampoline
there by then, and that second return runs into the trampoline with no
call of its own: the program dies (SIGILL). Such code is found by what it
does: it reads [sp] before its stack pointer moves (following its jumps,
as _setjmp's to __sigsetjmp)."""
from __future__ import annotations

import re

from ..objfile import fde, prologue

_FRAGMENT = re.compile(r"\.cold(\.\d+)?(?=$|[.@])")


def is_fragment_name(name: str | None) -> bool:
    """A name gcc (`f.cold`) or clang (`f.cold.1`) gives a split-off part."""
    return bool(name) and _FRAGMENT.search(name) is not None


def return_probe_refusal(disk, vaddr: int, name: str | None) -> str | None:
    """Why a return probe at vaddr of the file `disk` (OnDisk), named `name`
    (None: no symbol), would replace something other than a return
    address; None when calls land there."""
    if is_fragment_name(name):
        return (f"{name} is a part split off a function, reached by a jump, not "
                "called: [sp] holds no return address there")
    row = disk.entry_row(vaddr)
    if row is not None and not fde.is_call_entry(row):
        return (f"its CFI says [sp] holds no return address there (CFA "
                f"{_reg(row[1])}+{row[2]} at its first row): code that is jumped "
                "to, not called")
    if name is None and row is None:
        return ("no symbol names a function there and no CFI shows a call's "
                "return address at sp, so nothing shows that calls reach it")
    if keeps_return_address(disk, vaddr):
        return ("it reads its own return address to return to it a second time "
                "(as setjmp and getcontext do), and a return probe replaces it")
    return None


_READS_TOP = re.compile(r"^\w+, qword ptr \[rsp\]$")    # mov REG, [rsp]
_MOVES_SP = ("push", "pop", "call", "ret", "leave", "enter", "syscall")
_LOOK_AT_MOST = 64                 # instructions; setjmp reads it within ~20


def keeps_return_address(disk, vaddr: int) -> bool:
    """Whether the code from vaddr (of OnDisk `disk`) reads [sp], its
    return address, before the stack pointer moves, following
    unconditional jumps and going on past conditional ones."""
    at, looked = vaddr, 0
    while looked < _LOOK_AT_MOST:
        jumped = None
        for _addr, _size, mnem, ops in prologue.decode(disk.code(at, at + 256), at):
            looked += 1
            op = mnem.split()[-1] if mnem else mnem         # "notrack jmp"
            if op.startswith("mov") and _READS_TOP.match(ops):
                return True
            if op in _MOVES_SP or ops.startswith("rsp,") or looked >= _LOOK_AT_MOST:
                return False
            if op == "jmp":
                try:
                    jumped = int(ops, 0)
                except ValueError:
                    return False                              # an indirect jump
                break
        if jumped is None:
            return False                                      # the bytes ran out
        at = jumped
    return False


def fragment_note(disk, vaddr: int, name: str | None, label: str) -> str | None:
    """A line for the output when an entry probe is on a fragment (code
    that is jumped to): it fires, but not once per call of a function."""
    row = disk.entry_row(vaddr)
    if is_fragment_name(name) or (row is not None and not fde.is_call_entry(row)):
        return f"{label} is a fragment of a function (reached by a jump, not a call)"
    return None


def _reg(number: int) -> str:
    return {7: "rsp", 6: "rbp"}.get(number, f"r{number}")
