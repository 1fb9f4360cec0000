"""The vDSO as a file, for the unwinder (its CFI) and the symbolizer (its
names: `[vdso]` frames read `clock_gettime`, `gettimeofday`, …).

The vDSO is an ELF image the kernel maps into every process, and every
64-bit process on one kernel maps the same image. So ustack copies its own
(/proc/self/mem at its own [vdso] mapping: no ptrace rights needed, and the
target may be gone by the time a count is symbolized) once into the cache
directory, named by its content."""
from __future__ import annotations

import hashlib
import os
from typing import Optional

from . import cache as objcache

_path: Optional[str] = None


def vdso_file() -> Optional[str]:
    """The path of a copy of this kernel's 64-bit vDSO, or None."""
    global _path
    if _path is None:
        _path = _copy_own() or ""
    return _path or None


def _copy_own() -> Optional[str]:
    try:
        with open("/proc/self/maps") as f:
            line = next((ln for ln in f if ln.rstrip().endswith("[vdso]")), None)
        if line is None:
            return None
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        with open("/proc/self/mem", "rb") as f:
            image = os.pread(f.fileno(), hi - lo, lo)
    except (OSError, ValueError, OverflowError):
        return None
    if not image.startswith(b"\x7fELF"):
        return None
    path = os.path.join(objcache.cache_root(), "vdso",
                        f"{hashlib.sha1(image).hexdigest()}.so")
    if objcache.read(path) != image:
        objcache.write(path, image)
        if objcache.read(path) != image:
            return None                 # cache directory not writable
    return path
