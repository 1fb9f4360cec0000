"""What pprof's Mappings say about the objects behind the frames: each
object's GNU build-id, its mangled function names, and where its code sat
in each process (memory start, limit and file offset of the executable
segment), as far as the frames tell. perf_script.py asks it too: perf
prints a frame's address inside its object.

A Frame carries its runtime address, its object's path and, when named,
its function and offset. The symbol's address in the ELF file plus that
offset is where the frame lies in the file's own addresses; the difference
to the runtime address is the object's load bias in that process (0 for a
non-PIE executable). One named frame per (process, object) is enough; the
other frames of that object, named or not, share its bias. Kernel frames
(--kernel) come first in a stack, before the separator: split_kernel."""
from __future__ import annotations

import os

from ..model import Frame, UstackError
from ..objfile.debuginfo import debug_lookup
from ..objfile.elf import ElfImage
from ..symbols.kernel import KERNEL_MODULE
from ..symbols.stacks import SEPARATOR

PAGE = os.sysconf("SC_PAGE_SIZE")


def split_kernel(frames: tuple) -> tuple:
    """(kernel frames, user frames) of a stack's frames; quick for the
    usual stack without kernel frames (no frame-by-frame comparison)."""
    if not frames or frames[0].module != KERNEL_MODULE:
        return (), frames
    for i, f in enumerate(frames):
        if f == SEPARATOR:
            return frames[:i], frames[i + 1:]
    return (), frames


class ObjectFacts:
    """Build-ids, linkage names and load biases, each read once: images
    per path, biases per (pid, path)."""

    def __init__(self):
        self._images: dict = {}      # path -> (ElfImage, debug ElfImage | None) | None
        self._symbols: dict = {}     # (path, function) -> [Symbol]
        self._bias: dict = {}        # (pid, path) -> bias, once one frame told it
        self._segments: dict = {}    # (pid, path) -> [(start, limit, file offset)]

    def _image(self, path: str) -> tuple | None:
        if path not in self._images:
            found = None
            if path.startswith("/"):             # not [vdso], //anon, …
                try:
                    image = ElfImage.open(path)
                    debug = None if image.file.has_symtab else debug_lookup(image)[0]
                    found = (image, debug)
                except UstackError:
                    pass                          # gone or not ELF: facts unknown
            self._images[path] = found
        return self._images[path]

    def build_id(self, path: str) -> str:
        """The object's GNU build-id in hex; '' when unknown."""
        found = self._image(path)
        return (found[0].build_id or "") if found else ""

    def symbols(self, f: Frame) -> list:
        """The ELF symbols a named frame's function name stands for (the
        object's table, else its debug file's)."""
        key = (f.path, f.function)
        if key not in self._symbols:
            syms: list = []
            found = self._image(f.path) if f.function else None
            if found is not None:
                for image in found:
                    if image is not None and not syms:
                        syms = image.symbols.find(f.function)
            self._symbols[key] = syms
        return self._symbols[key]

    def system_name(self, f: Frame) -> str:
        """The linkage (mangled) name of a frame's function, if it differs."""
        syms = self.symbols(f)
        return syms[0].name if len({s.name for s in syms}) == 1 else f.function

    def learn(self, pid: int, f: Frame) -> None:
        """Find the load bias of f's object in process pid from f, a real
        (not inlined) named frame, unless known already."""
        if (pid, f.path) in self._bias or not f.function or f.inlined:
            return
        found = self._image(f.path)
        if found is None:
            return
        image = found[0]
        if not image.file.is_pie:
            self._bias[(pid, f.path)] = 0
            return
        biases = {f.addr - (s.address + f.offset) for s in self.symbols(f)
                  if image.file.executable(s.address + f.offset)}
        biases = {b for b in biases if b % PAGE == 0}
        if len(biases) == 1:                     # several: a name that is not unique
            self._bias[(pid, f.path)] = biases.pop()

    def object_address(self, pid: int, f: Frame) -> int | None:
        """f's address in its object's own (ELF) addresses, what addr2line
        takes; None when its object's bias is not known."""
        bias = self._bias.get((pid, f.path))
        return None if bias is None else f.addr - bias

    def segment(self, pid: int, f: Frame) -> tuple | None:
        """(memory start, memory limit, file offset) of the executable
        segment holding f in process pid, page-aligned as the kernel maps
        it; None when its object's bias is not known."""
        segments = self._segments.get((pid, f.path))
        if segments is None:
            bias = self._bias.get((pid, f.path))
            if bias is None:
                return None
            segments = self._segments[(pid, f.path)] = [
                (bias + vaddr - vaddr % PAGE, bias + -(-(vaddr + size) // PAGE) * PAGE,
                 offset - offset % PAGE)
                for vaddr, offset, size in self._image(f.path)[0].executable_segments()]
        for segment in segments:
            if segment[0] <= f.addr < segment[1]:
                return segment
        return None
