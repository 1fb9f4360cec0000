"""Which implementation an IFUNC symbol (libc's strlen, memcpy, …) runs on
this machine. The symbol's address is only its resolver, which the dynamic
linker calls once: a probe there never fires for the calls themselves.

The resolver's choice depends on the CPU (and GLIBC_TUNABLES), so it is
asked where it is safe to ask: in ustack's own process, for a library that
is already loaded here (dlopen with RTLD_NOLOAD runs no constructor), by
dlsym, which returns what the resolver returns. A library ustack has not
loaded itself is never loaded just to ask."""
from __future__ import annotations

import os

from ..kernel import procfs
from ..native.dynlink import resolved_address


def implementation(image, name: str) -> int | None:
    """The virtual address, in `image`'s file, of the code IFUNC `name`
    resolves to here; None when `image` is not loaded in this process."""
    mapping = _own_mapping(image.path)
    if mapping is None:
        return None
    mapped_vaddr = image.file.vaddr_of_file_offset(mapping.pgoff)
    address = resolved_address(image.path, name)
    if address is None or mapped_vaddr is None:
        return None
    vaddr = address - (mapping.start - mapped_vaddr)
    return vaddr if image.file.executable(vaddr) else None


_found: dict = {}       # (dev, inode) -> this process's mapping of it, once found


def _own_mapping(path: str):
    """An executable mapping of the file at `path` in this process, if any
    (kept once found: a glob over libc asks for each of its IFUNCs, and
    each read of /proc/self/maps cost ~1 ms)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if (st.st_dev, st.st_ino) in _found:
        return _found[st.st_dev, st.st_ino]
    for m in procfs.executable_mappings(os.getpid()):
        try:
            mst = os.stat(m.path)
        except OSError:
            continue
        if (mst.st_dev, mst.st_ino) == (st.st_dev, st.st_ino):
            _found[st.st_dev, st.st_ino] = m
            return m
    return None
