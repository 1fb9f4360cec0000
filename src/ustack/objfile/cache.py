"""The on-disk cache of what ustack derives from object files (unwind
tables, symbol tables), keyed by what each entry was built from (a hash of
those bytes, objfile/content_key.py; never by a build-id, which whoever
built the binary chooses): interpreting libc once costs more than the rest
of a run's start-up, reading the result back costs ms.

Layout: $USTACK_CACHE_DIR (default ~/.cache/ustack) / KIND / NAME.SUFFIX;
locks/ holds the empty files whose flock says whose turn it is to build
an entry (hold()). Caching is an optimization: unreadable or unwritable
files are not errors.

Trust: ustack often runs as root and believes what it reads here, so a
cache file is used only when neither it nor its directory can be written
by anyone but its owner, and that owner is the running user or root; links
are not followed. New directories are private (0700), new files 0600,
written through output.py (an unguessable O_EXCL name in the directory's
descriptor, renamed into place). Each entry carries a CRC-32: a damaged one
is rebuilt."""
from __future__ import annotations

import fcntl
import mmap
import os
import stat
import struct
import zlib

from ..model import UstackError
from ..output import lock_file_at, lstat_at, private_directory, replace_at, write_bytes_at


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


def lock_path(key: str) -> str:
    """The lock file of the work named `key` (see hold())."""
    return os.path.join(cache_root(), "locks", digest(key.encode()) + ".lock")


def hold(key: str) -> int | None:
    """Wait for, then hold until this process ends, the lock of the work
    named `key`: processes of different runs building the same entry take
    turns, and the later one finds it built. None (no lock: build anyway)
    when the cache directory cannot be had."""
    directory, name = os.path.split(lock_path(key))
    dir_fd = private_directory(directory, create=True)
    if dir_fd is None:
        return None
    try:
        fd = lock_file_at(dir_fd, name)
    finally:
        os.close(dir_fd)
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            os.close(fd)
            return None
    return fd


def memo_key(st: os.stat_result) -> tuple:
    """The in-memory memo key of what is derived from one file: a file
    replaced or rewritten in place (new inode or mtime) gets a new key."""
    return (st.st_dev, st.st_ino, st.st_mtime_ns)


def cache_file(kind: str, key: str, suffix: str) -> str:
    """Where the cached KIND built from the bytes whose key is `key` lives
    (objfile/content_key.py: a hash of those bytes, or of a file's
    identity where the builder reads the file itself)."""
    return os.path.join(cache_root(), kind, f"{key}.{suffix}")


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


# Each entry starts with a frame: a damaged entry (a flipped byte, a file
# cut short) is not read but built again and rewritten, never a traceback
# in the reader of the format. Entries of before the frame are rebuilt too.
_FRAME = struct.Struct("<8sIQ")         # magic, CRC-32 of the payload, its length
_MAGIC = b"ustack\x00\x02"


def _framed(blob: bytes) -> list:
    return [_FRAME.pack(_MAGIC, zlib.crc32(blob), len(blob)), blob]


def _whole(head: bytes, payload: bytes) -> bool:
    """Whether `payload` is what the frame's `head` says it is."""
    try:
        magic, crc, size = _FRAME.unpack(head)
    except struct.error:
        return False
    return magic == _MAGIC and len(payload) == size and zlib.crc32(payload) == crc


def _payload(data):
    """The payload of a framed entry (a view when `data` is an mmap), or
    None when the entry is damaged or of an older layout."""
    try:
        magic, crc, size = _FRAME.unpack_from(data)
    except struct.error:
        return None
    view = memoryview(data)[_FRAME.size:]
    if magic != _MAGIC or len(view) != size or zlib.crc32(view) != crc:
        return None
    return view


# directory -> its descriptor, judged by private_directory once per process:
# walking each component costs ~25 µs a read, and a run reads ~40 entries.
# Never closed (another thread may be reading in it); a directory removed
# since is walked again, and past _MAX_KEPT_DIRECTORIES (a process that
# points USTACK_CACHE_DIR at many) each read walks as before.
_read_dirs: dict = {}
_kept_fds: set = set()                  # every descriptor _read_dirs ever held
_MAX_KEPT_DIRECTORIES = 16


def _reading_directory(directory: str) -> int | None:
    """A descriptor of the cache directory to read in; the caller does not
    close it. None when it cannot be had or trusted."""
    fd = _read_dirs.get(directory)
    if fd is not None:
        try:
            if os.fstat(fd).st_nlink:       # 0: removed since it was judged
                return fd
        except OSError:
            pass
        _read_dirs.pop(directory, None)
    fd = private_directory(directory)
    if fd is None or len(_read_dirs) >= _MAX_KEPT_DIRECTORIES:
        return fd
    _kept_fds.add(fd)                       # before another thread can see it
    kept = _read_dirs.setdefault(directory, fd)
    if kept != fd:                          # another thread kept one first
        _kept_fds.discard(fd)
        os.close(fd)
    return kept


def _open_trusted(cache: str) -> int | None:
    """A read-only descriptor of the cache file, or None when it is missing
    or not to be trusted (a link, not a regular file, writable by others)."""
    directory, name = os.path.split(cache)
    dir_fd = _reading_directory(directory)
    if dir_fd is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dir_fd)
    except OSError:
        return None
    finally:
        if dir_fd not in _kept_fds:
            os.close(dir_fd)
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or not _trusted(st):
        os.close(fd)
        return None
    return fd


def read(cache: str, raw: bool = False) -> bytes | None:
    """The entry written by write(cache, …), or None when there is none to
    trust. `raw`: a file written whole with write(…, raw=True)."""
    fd = _open_trusted(cache)
    if fd is None:
        return None
    try:
        # unbuffered: the frame's head, then the payload read whole into
        # its own bytes (a copy of it out of the file's bytes was ~0.5 MB
        # of a one-hit trace's memory, libc's names and rows)
        with os.fdopen(fd, "rb", buffering=0) as f:
            if raw:
                return f.readall()
            head = f.read(_FRAME.size)
            payload = f.readall()
    except OSError:
        return None
    return payload if _whole(head, payload) else None


def read_mapped(cache: str):
    """The entry mapped read-only (pages shared, read on demand: a large
    table costs no memory of its own), as a memoryview, or None."""
    fd = _open_trusted(cache)
    if fd is None:
        return None
    try:
        return _payload(mmap.mmap(fd, 0, access=mmap.ACCESS_READ))
    except (OSError, ValueError):          # ValueError: an empty file
        return None
    finally:
        os.close(fd)


def write(cache: str, blob: bytes, raw: bool = False) -> None:
    """Atomically: a concurrent reader sees the old file or the new one.
    `raw`: the bytes alone (a file others open by its path: an ELF image),
    without the frame read() checks."""
    write_chunks(cache, [blob] if raw else _framed(blob))


def write_chunks(cache: str, chunks) -> bool:
    """write(cache, …, raw=True) of the bytes of the iterable `chunks` (a
    download, kept off the heap): whether the file is whole. An OSError
    raised by `chunks` leaves no file."""
    directory, name = os.path.split(cache)
    dir_fd = private_directory(directory, create=True)
    if dir_fd is None:
        return False
    try:
        st = lstat_at(dir_fd, name)
        if st is not None and (stat.S_ISLNK(st.st_mode) or not _trusted(st)):
            # a link is never followed, an entry another user could have
            # written never trusted (nor renamed over: output.replace_at
            # keeps others' files): the new entry takes its place
            os.unlink(name, dir_fd=dir_fd)
        write_bytes_at(dir_fd, name, chunks, 0o600)
        return True
    except (OSError, UstackError):
        return False                    # caching is an optimization
    finally:
        os.close(dir_fd)


def write_checked_file(cache: str, blob: bytes) -> None:
    """A file others open by its path (raw), and beside it the digest that
    checked_file() compares."""
    write(cache, blob, raw=True)
    write(cache + ".sum", digest(blob).encode())


def checked_file(cache: str) -> bool:
    """Whether write_checked_file(cache, …) left the file whole."""
    data = read(cache, raw=True)
    return data is not None and read(cache + ".sum") == digest(data).encode()


def trusted_file(cache: str) -> bool:
    """Whether the file at `cache` is one read() would trust (without
    reading it: a fetched debug file may be large)."""
    fd = _open_trusted(cache)
    if fd is None:
        return False
    os.close(fd)
    return True


def remove(cache: str) -> None:
    """Delete an entry (a refused one), reached as write() reached it."""
    directory, name = os.path.split(cache)
    dir_fd = private_directory(directory)
    if dir_fd is None:
        return
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def rename(cache: str, new_name: str) -> bool:
    """Give the entry `cache` the name `new_name` in its directory (a
    checked file taking its place): whether it was."""
    directory, name = os.path.split(cache)
    dir_fd = private_directory(directory)
    if dir_fd is None:
        return False
    try:
        replace_at(dir_fd, name, new_name, os.path.join(directory, new_name))
        return True
    except (OSError, UstackError):
        return False
    finally:
        os.close(dir_fd)
