"""Where the kernel fields ustack's BPF programs read lie on the running
kernel, from its BTF (btf.FieldOffsets: ~20 ms, it walks only the first
~1,000 of ~125 k types), cached per kernel build (a few ms less)."""
from __future__ import annotations

import json
import os

from ..kernel import btf
from ..objfile import cache as objcache

# attribute -> (struct, field; a dotted field goes into nested structs)
FIELDS = {
    "vm_start": ("vm_area_struct", "vm_start"),
    "vm_end": ("vm_area_struct", "vm_end"),
    "vm_pgoff": ("vm_area_struct", "vm_pgoff"),
    "vm_file": ("vm_area_struct", "vm_file"),
    "f_inode": ("file", "f_inode"),
    "i_ino": ("inode", "i_ino"),
    "i_sb": ("inode", "i_sb"),
    "s_dev": ("super_block", "s_dev"),
    "task_mm": ("task_struct", "mm"),
    "vm_mm": ("vm_area_struct", "vm_mm"),
    "mm_vdso": ("mm_struct", "context.vdso"),
    "mm_ctx_id": ("mm_struct", "context.ctx_id"),
    "mm_start_stack": ("mm_struct", "start_stack"),       # a deferred copy's end (unwind.h)
    "task_exit_state": ("task_struct", "exit_state"),    # x86: never reused, unlike the mm
    "task_stack": ("task_struct", "stack"),
    "task_pid": ("task_struct", "pid"),
    "task_fsbase": ("task_struct", "thread.fsbase"),     # x86-64: pthread_self()
    "task_runtime": ("task_struct", "se.sum_exec_runtime"),  # CPU time used, ns
}
_CACHE_LAYOUT = "offsets8"


class Offsets:
    """The byte offsets of FIELDS on this kernel, as attributes."""

    def __init__(self, values: dict):
        for name in FIELDS:
            setattr(self, name, int(values[name]))

    @classmethod
    def of_this_kernel(cls) -> "Offsets":
        """From ustack's cache when this kernel's BTF was parsed before."""
        try:
            st = os.stat(btf.VMLINUX)
        except OSError:
            st = None
        key = f"{os.uname().release}\0{os.uname().version}\0{st and st.st_size}"
        cache = objcache.cache_file("btf", objcache.digest(key.encode()), _CACHE_LAYOUT)
        blob = objcache.read(cache)
        if blob:
            try:
                values = json.loads(blob)
                if values.get("key") == key:
                    return cls(values)
            except (ValueError, KeyError, TypeError):
                pass
        b = btf.vmlinux_offsets()
        values = {name: b.offset(struct, field) for name, (struct, field) in FIELDS.items()}
        objcache.write(cache, json.dumps({"key": key, **values}).encode())
        return cls(values)
