"""The on-disk cache of what ustack derives from object files (unwind
tables, symbol tables), keyed by build-id: interpreting libc once costs more
than the rest of a run's start-up, reading the result back costs ms.

Layout: $USTACK_CACHE_DIR (default ~/.cache/ustack) / KIND / NAME.SUFFIX.
Caching is an optimization: unreadable or unwritable files are not errors.

Trust: ustack often runs as root and believes what it reads here, so a
cache file is used only when neither it nor its directory can be written
by anyone but its owner, and that owner is the running user or root; links
are not followed. New directories are private (0700), new files 0600,
written under a fresh O_EXCL name and renamed into place."""
from __future__ import annotations

import mmap
import os
import stat


def digest(data: bytes) -> str:
    """SHA-1 of `data` in hex: short file names for long keys. Taken from
    CPython's own _sha1 where it has one: hashlib first loads OpenSSL's
    libcrypto, ~3 ms of every start (the digest is the same)."""
    try:
        from _sha1 import sha1
    except ImportError:
        from hashlib import sha1
    return sha1(data).hexdigest()


def cache_root() -> str:
    return os.environ.get("USTACK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ustack")


def memo_key(st: os.stat_result) -> tuple:
    """The in-memory memo key of what is derived from one file: a file
    replaced or rewritten in place (new inode or mtime) gets a new key."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def cache_file(kind: str, path: str, st: os.stat_result,
               build_id: str | None, suffix: str) -> str:
    """Where the cached KIND of the object at `path` lives."""
    if build_id:
        name = build_id
    else:  # no build-id: the file's identity stands in for its content
        ident = f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}"
        name = "path-" + digest(ident.encode())
    return os.path.join(cache_root(), kind, f"{name}.{suffix}")


def identity_file(kind: str, st: os.stat_result, suffix: str) -> str:
    """Where the cached KIND of exactly this file lives, found without
    reading it: keyed by device, inode, size, mtime and ctime (ctime cannot
    be set back, so a file rewritten in place gets a new name), not by
    path: the same file seen through /proc/PID/root/… or a link is one."""
    ident = f"{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return os.path.join(cache_root(), kind,
                        f"{digest(ident.encode())}.{suffix}")


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (os.geteuid(), 0) and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted_dir(directory: str) -> bool:
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and _trusted(st)


def _open_trusted(cache: str) -> int | None:
    """A read-only descriptor of the cache file, or None when it is missing
    or not to be trusted (a link, not a regular file, writable by others)."""
    if not _trusted_dir(os.path.dirname(cache)):
        return None
    try:
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or not _trusted(st):
        os.close(fd)
        return None
    return fd


def read(cache: str) -> bytes | None:
    fd = _open_trusted(cache)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_mapped(cache: str):
    """The cache file mapped read-only (pages shared, read on demand: a
    large table costs no memory of its own), or None."""
    fd = _open_trusted(cache)
    if fd is None:
        return None
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):          # ValueError: an empty file
        return None
    finally:
        os.close(fd)


def write(cache: str, blob: bytes) -> None:
    """Atomically: a concurrent reader sees the old file or the new one."""
    directory = os.path.dirname(cache)
    tmp = f"{cache}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        if not _trusted_dir(directory):
            return
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, cache)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
