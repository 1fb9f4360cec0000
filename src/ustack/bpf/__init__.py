"""ustack's BPF programs in C (*.bpf.c), their shared header (ustack.h)
and the objects built from them, which ship as package data: loading them
needs no compiler (kernel/bpf_object.py). build.py rebuilds the objects."""
from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))


def object_path(name: str) -> str:
    """The built object of NAME.bpf.c."""
    return os.path.join(HERE, f"{name}.bpf.o")
