"""[vdso] frames. The kernel's vDSO is read from ustack's copy of it
(objfile/vdso.py; objfile.mapped.object_path finds it) and named by the ELF
source like any object; its frames show module `vdso`."""
from __future__ import annotations

from ..model import Frame, Mapping

VDSO_MODULE = "vdso"


def is_vdso(m: Mapping) -> bool:
    return m.path == "[vdso]"


def unnamed_frame(m: Mapping, addr: int) -> Frame:
    """A [vdso] we hold no copy of (another size: a 32-bit process)."""
    return Frame(addr=addr, module=VDSO_MODULE, path=m.path)
