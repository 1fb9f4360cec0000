"""The vDSO as a file, for the unwinder (its CFI) and the symbolizer (its
names: `[vdso]` frames read `clock_gettime`, `gettimeofday`, …).

The vDSO is an ELF image the kernel maps into every process, and every
64-bit process on one kernel maps the same image. So ustack copies its own
(/proc/self/mem at its own [vdso] mapping: no ptrace rights needed, and the
target may be gone by the time a count is symbolized) once into the cache
directory, named by its content. A [vdso] mapping of another size (a 32-bit
process, another kernel's recorded maps) is not that image: no copy for it."""
from __future__ import annotations

import os

from ..kernel.procfs import own_vdso
from ..model import Mapping
from . import cache as objcache

_copy: tuple | None = None     # (path, size) of the copy, or () if none


def vdso_file() -> str | None:
    """The path of a copy of this kernel's 64-bit vDSO, or None."""
    global _copy
    if _copy is None:
        _copy = _copy_own() or ()
    return _copy[0] if _copy else None


def vdso_path(m: Mapping) -> str | None:
    """The copy of the vDSO to read for the [vdso] mapping m, or None when
    m is no vDSO or its size is not that of the copy."""
    if m.path != "[vdso]" or vdso_file() is None:
        return None
    path, size = _copy
    return path if m.end - m.start == size else None


def _copy_own() -> tuple | None:
    own = own_vdso()
    if own is None:
        return None
    _, image = own
    if not image.startswith(b"\x7fELF"):
        return None
    path = os.path.join(objcache.cache_root(), "vdso",
                        f"{objcache.digest(image)}.so")
    if objcache.read(path, raw=True) != image:       # an ELF file, read by its path
        objcache.write(path, image, raw=True)
        if objcache.read(path, raw=True) != image:
            return None                 # cache directory not writable
    return path, len(image)
