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
(--kernel) come first in a stack, before the separator: split_kernel.

Frames are matched by their linkage names first: a demangled name
(`v8::internal::Foo(int)`) is only looked up through the object's
demangled index (node: ~1 s to demangle 86,000 names) when no frame of
that object in that process had a plain one; with the bias known, a
frame's function is found by its address."""
from __future__ import annotations

import os

from ..model import Frame, UstackError
from ..objfile.debuginfo import debug_lookup
from ..objfile.elf import ElfImage
from ..symbols.kernel import KERNEL_MODULE
from ..symbols.stacks import SEPARATOR

PAGE = os.sysconf("SC_PAGE_SIZE")
_LATER_FRAMES = 16          # demangled frames kept per (process, object) to learn its bias from


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
        self._later: dict = {}       # (pid, path) -> [Frame] named only in demangled form

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

    def _linkage_starts(self, f: Frame) -> list:
        """The start addresses of f's function when its name is a linkage
        name as it stands (lookup() gave it: the object's table, else its
        debug file's)."""
        found = self._image(f.path) if f.function else None
        for image in found or ():
            if image is not None:
                starts = image.symbols.starts_named(f.function)
                if starts:
                    return starts
        return []

    def system_name(self, f: Frame, pid: int | None = None) -> str:
        """The linkage (mangled) name of a frame's function, if it differs;
        `pid`: a process it ran in (its object's bias finds it by address)."""
        if self._linkage_starts(f):
            return f.function
        if pid is not None and not f.inlined:
            at = self.object_address(pid, f)
            found = self._image(f.path) if at is not None else None
            for image in reversed(found or ()):  # the debug file's full table first
                sym = image.symbols.lookup(at) if image is not None else None
                if sym is not None and sym.address == at - f.offset:
                    return sym.name
        syms = self.symbols(f)
        return syms[0].name if len({s.name for s in syms}) == 1 else f.function

    def learn(self, pid: int, f: Frame) -> None:
        """Find the load bias of f's object in process pid from f, a real
        (not inlined) named frame, unless known already; a frame named
        only in demangled form is kept for later (object_address)."""
        if (pid, f.path) in self._bias or f.inlined:
            return
        if not f.function:
            # an unnamed frame of a file knows its place in the object exactly
            if f.objaddr and (f.addr - f.objaddr) % PAGE == 0:
                self._bias[(pid, f.path)] = f.addr - f.objaddr
            return
        found = self._image(f.path)
        if found is None:
            return
        image = found[0]
        if not image.file.is_pie:
            self._bias[(pid, f.path)] = 0
            return
        starts = self._linkage_starts(f)
        if not starts:
            later = self._later.setdefault((pid, f.path), [])
            if len(later) < _LATER_FRAMES:
                later.append(f)
            return
        self._learn_from(pid, f, image, starts)

    def _learn_from(self, pid: int, f: Frame, image, starts) -> None:
        biases = {f.addr - (start + f.offset) for start in starts
                  if image.file.executable(start + f.offset)}
        biases = {b for b in biases if b % PAGE == 0}
        if len(biases) == 1:                     # several: a name that is not unique
            self._bias[(pid, f.path)] = biases.pop()

    def _bias_of(self, pid: int, path: str) -> int | None:
        """The bias learnt, else the one the demangled frames kept tell."""
        bias = self._bias.get((pid, path))
        if bias is None and (pid, path) in self._later:
            image = self._image(path)[0]
            for f in self._later.pop((pid, path)):
                self._learn_from(pid, f, image, [s.address for s in self.symbols(f)])
                if (pid, path) in self._bias:
                    break
            bias = self._bias.get((pid, path))
        return bias

    def object_address(self, pid: int, f: Frame) -> int | None:
        """f's address in its object's own (ELF) addresses, what addr2line
        takes; None when its object's bias is not known."""
        bias = self._bias_of(pid, f.path)
        return None if bias is None else f.addr - bias

    def segment(self, pid: int, f: Frame) -> tuple | None:
        """(memory start, memory limit, file offset) of the executable
        segment holding f in process pid, page-aligned as the kernel maps
        it; None when its object's bias is not known."""
        segments = self._segments.get((pid, f.path))
        if segments is None:
            bias = self._bias_of(pid, f.path)
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
