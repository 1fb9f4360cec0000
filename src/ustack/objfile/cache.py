"""The on-disk cache of what ustack derives from object files (unwind
tables, symbol tables), keyed by build-id: interpreting libc once costs more
than the rest of a run's start-up, reading the result back costs ms.

Layout: $USTACK_CACHE_DIR (default ~/.cache/ustack) / KIND / NAME.SUFFIX.
Caching is an optimization: unreadable or unwritable files are not errors."""
from __future__ import annotations

import hashlib
import os
from typing import Optional


def cache_root() -> str:
    return os.environ.get("USTACK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ustack")


def memo_key(st: os.stat_result) -> tuple:
    """The in-memory memo key of what is derived from one file: a file
    replaced or rewritten in place (new inode or mtime) gets a new key."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def cache_file(kind: str, path: str, st: os.stat_result,
               build_id: Optional[str], suffix: str) -> str:
    """Where the cached KIND of the object at `path` lives."""
    if build_id:
        name = build_id
    else:  # no build-id: the file's identity stands in for its content
        ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
        name = "path-" + hashlib.sha1(ident.encode()).hexdigest()
    return os.path.join(cache_root(), kind, f"{name}.{suffix}")


def read(cache: str) -> Optional[bytes]:
    try:
        with open(cache, "rb") as f:
            return f.read()
    except OSError:
        return None


def write(cache: str, blob: bytes) -> None:
    """Atomically: a concurrent reader sees the old file or the new one."""
    tmp = f"{cache}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(cache), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, cache)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
