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

# cache directory -> (path, size) of the copy there, or () if none could be
# made: kept per directory, so one that cannot be written (USTACK_CACHE_DIR
# pointed elsewhere for a while) does not deny the copy for the process's life
_copies: dict = {}


def _copy() -> tuple:
    root = objcache.cache_root()
    if root not in _copies:
        _copies[root] = _copy_own(root) or ()
    return _copies[root]


def vdso_file() -> str | None:
    """The path of a copy of this kernel's 64-bit vDSO, or None."""
    copy = _copy()
    return copy[0] if copy else None


def vdso_path(m: Mapping) -> str | None:
    """The copy of the vDSO to read for the [vdso] mapping m, or None when
    m is no vDSO or its size is not that of the copy."""
    if m.path != "[vdso]":
        return None
    copy = _copy()
    if not copy:
        return None
    path, size = copy
    return path if m.end - m.start == size else None


def _copy_own(root: str) -> tuple | None:
    own = own_vdso()
    if own is None:
        return None
    _, image = own
    if not image.startswith(b"\x7fELF"):
        return None
    path = os.path.join(root, "vdso",
                        f"{objcache.digest(image)}.so")
    if objcache.read(path, raw=True) != image:       # an ELF file, read by its path
        objcache.write(path, image, raw=True)
        if objcache.read(path, raw=True) != image:
            return None                 # cache directory not writable
    return path, len(image)
