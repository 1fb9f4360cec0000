"""The vDSO as an ElfImage, so `[vdso]` frames get names
(`__vdso_clock_gettime`, `__vdso_gettimeofday`, …).

The vDSO is an ELF image the kernel maps into every process. All 64-bit
processes get the same image from one kernel, so ustack reads its own copy
(/proc/self/mem at its own [vdso] mapping: no ptrace rights needed, and the
target may be gone by the time a count is symbolized). When the target's
mapping has another size (a 32-bit or x32 process has another vDSO), the
target's own copy is read from /proc/PID/mem instead. The bytes are saved
once in the cache directory, named by their hash, for ElfImage to open."""
from __future__ import annotations

import hashlib
import os
from typing import Optional

from ..model import UstackError
from ..objfile import cache as objcache
from ..objfile.elf import ElfImage

_images: dict = {}   # size -> ElfImage | None, for our own kernel's image


def vdso_image(pid: int, start: int, end: int) -> Optional[ElfImage]:
    size = end - start
    if size not in _images:
        own = _own_vdso()
        blob = own if own is not None and len(own) == size else _read_mem(pid, start, size)
        _images[size] = _open(blob)
    return _images[size]


def _own_vdso() -> Optional[bytes]:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("[vdso]"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    return _read_mem("self", lo, hi - lo)
    except OSError:
        pass
    return None


def _read_mem(pid, start: int, size: int) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/mem", "rb") as f:
            return os.pread(f.fileno(), size, start)
    except (OSError, OverflowError):
        return None


def _open(blob: Optional[bytes]) -> Optional[ElfImage]:
    if not blob or not blob.startswith(b"\x7fELF"):
        return None
    path = os.path.join(objcache.cache_root(), "vdso",
                        hashlib.sha1(blob).hexdigest() + ".so")
    if objcache.read(path) != blob:
        objcache.write(path, blob)
    try:
        return ElfImage.open(path)
    except UstackError:
        return None
