"""Separate debug files, found the way gdb finds them by build-id:
/usr/lib/debug/.build-id/xx/yyyy.debug. A file whose build-id differs from
the object's is refused: a wrong debug file gives wrong names."""
from __future__ import annotations

import os
from typing import Optional

from ..model import UstackError
from .elf import ElfImage

DEBUG_ROOTS = ["/usr/lib/debug"]


def build_id_path(build_id: Optional[str]) -> Optional[str]:
    """The debug file for a build-id under DEBUG_ROOTS, if one is installed."""
    if not build_id or len(build_id) < 3:
        return None
    for root in DEBUG_ROOTS:
        path = os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")
        if os.path.exists(path):
            return path
    return None


def debug_image(image: ElfImage) -> Optional[ElfImage]:
    """The opened debug file of `image`, or None (none installed, unreadable,
    or its build-id does not match)."""
    path = build_id_path(image.build_id)
    if path is None:
        return None
    try:
        debug = ElfImage.open(path)
    except UstackError:
        return None
    return debug if debug.build_id == image.build_id else None
