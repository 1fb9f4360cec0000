"""glibc's signal trampoline, __restore_rt, by its code: what both walks
(the kernel's rows, dwarf.py) and the names (a frame just after it) know
of it, apart from the DWARF unwinder so that those who only compare
bytes do not import it."""
from __future__ import annotations

# glibc's __restore_rt: mov $15,%rax (rt_sigreturn); syscall.
RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")
# what may follow it as padding before the next function (nop, int3, the
# multi-byte nops): the pc just after its syscall is the trampoline's only
# where these follow, never another function's first instruction
_PADDING = (b"\x90", b"\xcc", b"\x0f\x1f", b"\x66\x90", b"\x66\x0f\x1f", b"\x66\x2e\x0f\x1f")


def just_after_trampoline(image, vaddr: int) -> bool:
    """Whether an exact pc at vaddr of `image` (an objfile.elf.ElfImage) is
    __restore_rt's, just after its syscall (the rt_sigreturn event, or a
    sample while the kernel runs it)."""
    return (image.read(vaddr - len(RESTORE_RT), len(RESTORE_RT)) == RESTORE_RT
            and image.read(vaddr, 4).startswith(_PADDING))
