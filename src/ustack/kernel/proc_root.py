"""Files as a process in another mount namespace (a container) sees them.

Two doors, both safe against a container that plants symbolic links:
- /proc/PID/map_files/START-END opens exactly the file a mapping maps
  (the same inode, even when its path is a different file on the host,
  is missing here, or was deleted), with no path walk at all;
- openat2(2) with RESOLVE_IN_ROOT on /proc/PID/root resolves a path the
  way the process does: an absolute symlink and `..` stay inside its root
  (a plain open of /proc/PID/root/PATH would follow an absolute link
  against *our* root: /tmp -> /etc would read the host's /etc).

A file found through either is pinned: its descriptor is kept open and the
file is named /proc/self/fd/N, so it can still be read after the process
has exited (a count is symbolized at the end of the run)."""
from __future__ import annotations

import os
import re
import stat

NR_OPENAT2 = 437                    # x86_64
RESOLVE_NO_MAGICLINKS = 0x02        # include/uapi/linux/openat2.h
RESOLVE_IN_ROOT = 0x10
MAX_PINNED = 512                    # descriptors held for foreign files

def open_in_root(root: str, path: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of `path` resolved inside the directory `root` as if it
    were "/" (symlinks, `..` and the final component too, unless flags has
    O_NOFOLLOW). Raises OSError."""
    dirfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _openat2(dirfd, path, flags | os.O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    finally:
        os.close(dirfd)


_openat2_call = None


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    """openat2(2) through ctypes, bound on first use: most runs open no
    file in another root, and ctypes costs ~1.5 ms to import."""
    global _openat2_call
    import ctypes
    if _openat2_call is None:
        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                        ("resolve", ctypes.c_uint64)]
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        _openat2_call = (libc.syscall, OpenHow)
    syscall, open_how = _openat2_call
    how = open_how(flags, 0, resolve)
    fd = syscall(NR_OPENAT2, dirfd, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def foreign_root(pid: int) -> str | None:
    """/proc/PID/root when the process's root directory is not ours (a
    container, a chroot); None when it is ours or the process is gone."""
    root = f"/proc/{pid}/root"
    try:
        return None if os.path.samestat(os.stat(root), os.stat("/")) else root
    except OSError:
        return None


def ns_pids(pid: int) -> tuple:
    """The ids of process (or thread) `pid` in each pid namespace it is
    in, ours first (NSpid in /proc/PID/status); () when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return tuple(int(x) for x in line.split()[1:])
    except (OSError, ValueError):
        pass
    return ()


# a container may have put a FIFO where its file was: never block on it
_PEEK = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK


def _regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _identity(path_or_fd) -> tuple | None:
    try:
        st = os.stat(path_or_fd)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


class _Pins:
    """Descriptors kept open for files only a process's root reaches, one
    per file (device, inode), at most MAX_PINNED."""

    def __init__(self):
        self.paths: dict = {}           # (dev, ino) -> /proc/self/fd/N

    def get(self, ident: tuple) -> str | None:
        return self.paths.get(ident)

    def add(self, ident: tuple, fd: int) -> str:
        """The pinned path of fd's file ("" when MAX_PINNED are held: fd
        is closed then)."""
        if ident in self.paths or len(self.paths) >= MAX_PINNED:
            os.close(fd)
            return self.paths.get(ident, "")
        path = self.paths[ident] = f"/proc/self/fd/{fd}"
        return path


_PINS = _Pins()
_BACKING: dict = {}                 # overlayfs st_dev -> its layers' st_devs


def backing_devices(st_dev: int) -> tuple:
    """The devices of the layers of the overlayfs (a container's root)
    with device st_dev, learnt when one of its files was found; () for
    other filesystems. The kernel's vma of a file mapped from an overlay
    holds the layer's file: its inode number, the layer's device."""
    return _BACKING.get(st_dev, ())


def _learn_backing(pid: int, st_dev: int) -> None:
    """Read the layers of the overlay with device st_dev from the mount
    table of process `pid` (its mount namespace has the overlay)."""
    if st_dev in _BACKING:
        return
    want = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    devs: set = set()
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 10 or fields[2] != want or "-" not in fields:
            continue
        rest = fields[fields.index("-") + 1:]
        if len(rest) < 3 or rest[0] != "overlay":
            continue
        for option in rest[2].split(","):
            name, _, value = option.partition("=")
            if name in ("lowerdir", "upperdir"):
                for layer in value.split(":"):
                    try:
                        devs.add(os.stat(layer).st_dev)
                    except OSError:
                        pass
        break
    devs.discard(st_dev)
    _BACKING[st_dev] = tuple(devs)


def mapped_file(pid: int, path: str, start: int | None = None,
                end: int | None = None) -> str:
    """Where this tool opens the file process `pid` maps at `path` (in the
    mapping start-end when known): "" when `path` itself is that file here,
    else a pinned /proc/self/fd/N, else "" when nothing better is known
    (the process is gone and shares our root, or the file cannot be found).
    """
    if not path.startswith("/"):
        return ""
    here = _identity(path)
    if start is not None and end is not None:
        exact = f"/proc/{pid}/map_files/{start:x}-{end:x}"
        mapped = _identity(exact)
        if mapped is not None:
            if mapped == here:
                return ""
            _learn_backing(pid, mapped[0])
            return _PINS.get(mapped) or _pin(exact, mapped)
    root = foreign_root(pid)
    if root is None:
        return ""
    try:
        fd = open_in_root(root, path, _PEEK)
    except OSError:
        return ""
    ident = _identity(fd) if _regular(fd) else None
    if ident is not None and ident != here:
        _learn_backing(pid, ident[0])
    if ident is None or ident == here or _PINS.get(ident):
        os.close(fd)
        return "" if ident is None or ident == here else _PINS.get(ident)
    return _PINS.add(ident, fd) or root + path     # unpinned: while it lives


_PER_PROCESS = re.compile(r"/proc/\d+/")


def lasting_path(path: str) -> str:
    """`path`, or when it lives under /proc/PID/ (exe, root/…, map_files/…)
    and so dies with the process, a pinned /proc/self/fd/N of its file: an
    object first opened that way stays readable after the process exits."""
    if not _PER_PROCESS.match(os.fspath(path)):
        return path
    try:
        fd = os.open(path, _PEEK)
    except OSError:
        return path
    ident = _identity(fd) if _regular(fd) else None
    known = _PINS.get(ident) if ident else None
    if known or ident is None:
        os.close(fd)
        return known or path
    return _PINS.add(ident, fd) or path


def _pin(exact: str, ident: tuple) -> str:
    try:
        fd = os.open(exact, _PEEK)
    except OSError:
        return ""
    if _identity(fd) != ident:          # the mapping changed meanwhile
        os.close(fd)
        return ""
    return _PINS.add(ident, fd) or exact
