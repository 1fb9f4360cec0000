"""Which unwinder a probe's samples need: `--unwind auto` decides per probe.

Frame pointers are cheap (the kernel walks them, nothing is copied) but only
right when every frame keeps rbp; DWARF needs registers plus a stack copy
per sample. auto takes frame pointers where the code on the stack is known to
keep them (a uprobe in a binary built with them, or any Go program), and
DWARF where the stack passes through code that does not: syscalls and
tracepoints (Debian's libc has no frame pointers), timed samples, and
binaries built without them."""
from __future__ import annotations

from typing import Optional

from ..model import UprobeTarget, UstackError
from ..objfile import prologue
from ..objfile.elf import ElfImage

PUSH_RBP_MOV_RSP_RBP = b"\x55\x48\x89\xe5"
PROLOGUE_BYTES = 32
SAMPLE_FUNCTIONS = 64
# Start-up code the toolchain links into every program, built its own way:
# it says nothing about how the program itself was compiled.
CRT_FUNCTIONS = {"deregister_tm_clones", "register_tm_clones", "frame_dummy"}


def keeps_frame_pointers(path: str) -> bool:
    """True if the binary is Go, or most of its own functions set up a frame
    with `push %rbp; mov %rsp,%rbp` near their start."""
    try:
        image = ElfImage.open(path)
    except UstackError:
        return False
    if image.is_go:
        return True
    funcs = [f for f in image.functions if f.size >= 8
             and not f.name.startswith("_") and f.name not in CRT_FUNCTIONS
             ][:SAMPLE_FUNCTIONS]
    if not funcs:
        return False
    framed = sum(prologue.sets_up_frame_pointer(image, f) for f in funcs)
    return framed >= 0.8 * len(funcs)


def choose(probe, requested: str, main_binary: Optional[str] = None) -> str:
    """'fp' or 'dwarf' for one resolved probe; `main_binary` is the traced
    program when known (-p/-c), which decides for syscalls and samples."""
    if requested in ("fp", "dwarf"):
        return requested
    if isinstance(probe, UprobeTarget):
        return "fp" if keeps_frame_pointers(probe.path) else "dwarf"
    if main_binary is not None:
        try:
            if ElfImage.open(main_binary).is_go:
                return "fp"            # Go makes its syscalls without libc
        except UstackError:
            pass
    return "dwarf"
