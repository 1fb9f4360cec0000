"""The keys of the on-disk cache: a hash of the very bytes an entry was
built from (objfile/cache.py names entries by them). A build-id or a
table's size is chosen by whoever built the binary: a same-build-id copy
with renamed functions or other unwind rules, opened once by root, would
otherwise name and unwind the real binary's frames for every later run.

Hashing is not free (node's 12 MB of symbol tables: ~50 ms on a busy
2-CPU machine; finding its signal trampolines scans all its code, 0.2 s),
so a key that a warm run needs before it reads an entry (unwind tables and
rows) is remembered per file identity (remembered()): computed once per
version of that file, read back as a few bytes after. That memo only ever
answers for the file it was computed from; which entry serves is decided
by the hash alone, and a builder names what it built by the hash of what
it parsed. Symbol tables need no memo: they are hashed only when this
version of the file has no functions kept yet (objfile/elf.py keeps them
per file identity)."""
from __future__ import annotations

import os

from . import cache as objcache

try:
    from _blake2 import blake2b     # hashlib loads OpenSSL's libcrypto first (~3 ms)
except ImportError:                  # pragma: no cover - a Python without it
    from hashlib import blake2b

VERSION = "k1"          # of the memo files' meaning
_memo: dict = {}        # (kind, identity) -> key, for this process


class Hasher:
    """A key of several parts: each is framed by its length, so parts
    that meet differently never hash alike."""

    def __init__(self, kind: str):
        self._hash = blake2b(digest_size=20)
        self.add(kind.encode())

    def add(self, part) -> "Hasher":
        if isinstance(part, str):
            part = part.encode()
        self._hash.update(len(part).to_bytes(8, "little"))
        self._hash.update(part)
        return self

    def key(self) -> str:
        return self._hash.hexdigest()


def of(kind: str, *parts) -> str:
    """The key of `parts` (bytes or str) for entries of `kind`."""
    hasher = Hasher(kind)
    for part in parts:
        hasher.add(part)
    return hasher.key()


def identity(st: os.stat_result) -> tuple:
    """A file version: device, inode, size, mtime and ctime (ctime cannot
    be set back, so a file rewritten in place is another version)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remembered(kind: str, st: os.stat_result, compute) -> str:
    """compute() (the key of the bytes of the file whose stat is `st`),
    computed once per version of that file: in memory, then on disk."""
    key = known(kind, st)
    if key is None:
        key = _memo[(kind, identity(st))] = compute()
        objcache.write(_memo_file(kind, st), key.encode())
    return key


def known(kind: str, st: os.stat_result) -> str | None:
    """remembered()'s answer if it was computed before, else None."""
    memo_key = (kind, identity(st))
    key = _memo.get(memo_key)
    if key is None:
        saved = objcache.read(_memo_file(kind, st))
        if saved is not None and len(saved) == 40 and saved.isalnum():
            key = _memo[memo_key] = saved.decode()
    return key


def saved(kind: str, st: os.stat_result) -> bytes | None:
    """What save(kind, st, …) kept for this version of the file, if anything."""
    return objcache.read(_memo_file(kind, st))


def save(kind: str, st: os.stat_result, blob: bytes) -> None:
    """Keep `blob` for this version of the file (device, inode, size,
    mtime, ctime): what was found out about it, never about another."""
    objcache.write(_memo_file(kind, st), blob)


def _memo_file(kind: str, st: os.stat_result) -> str:
    return objcache.identity_file("keys", st, f"{kind}.{VERSION}")


def forget() -> None:
    """Forget the keys held in memory (the disk memo stays)."""
    _memo.clear()


def of_files(*stats) -> str:
    """The key of entries whose builder reads the files itself (libdw,
    symbolic, the DWARF and Go readers: what they read cannot be hashed as
    it is parsed): the files' versions, so an entry serves only the very
    files it was built from. None in `stats`: a file that is not there."""
    return of("files", *(repr(identity(st)) if st is not None else "-" for st in stats))


def of_dwarf(st: os.stat_result, alt_path: str | None) -> str:
    """The key of what libdw, symbolic or pyelftools read of the file
    whose stat is `st` and of its dwz alt file (line tables, units,
    parameters)."""
    try:
        alt = os.stat(alt_path) if alt_path else None
    except OSError:
        alt = None
    return of_files(st, alt)
