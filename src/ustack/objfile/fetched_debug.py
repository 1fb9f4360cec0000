"""Where a debug file fetched from a debuginfod server is kept, by build-id:
what the debug-file lookup reads (objfile/debuginfo.py) and the fetcher
writes (objfile/debuginfod.py), apart from the fetcher so that the lookup
does not import it."""
from __future__ import annotations

import os

from . import cache as objcache

_HEX = frozenset("0123456789abcdef")


def valid_build_id(build_id: str | None) -> bool:
    return bool(build_id) and len(build_id) >= 8 and set(build_id) <= _HEX


def cache_path(build_id: str) -> str:
    return os.path.join(objcache.cache_root(), "debuginfod", build_id + ".debug")


def cached_debug_file(build_id: str | None) -> str | None:
    """The fetched debug file of build_id in the cache, when there is one
    to trust (its build-id is checked again by whoever opens it)."""
    if not valid_build_id(build_id):
        return None
    path = cache_path(build_id)
    return path if objcache.trusted_file(path) else None
