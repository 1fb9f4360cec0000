"""A run's tracing name, and the lock that proves the run alive.

The ftrace instance and uprobe group of a run are named after it
(ustack_<pid>; inside another pid namespace ustack_<pid>_<namespace inode>,
since pids repeat across namespaces). The run holds an exclusive flock on
LOCK_DIR/<name> for as long as anything of that name may exist; its
guardian (kernel/guardian.py) shares the lock, so a SIGKILLed run stays
"alive" until the guardian has removed what it left. A cleanup removes a
name's tracing only when it can take that lock itself: a flock is seen
across pid namespaces, where /proc/<pid> is not. What it cannot lock (no
lock file: another mount namespace's /run, or an unusable LOCK_DIR) it
leaves alone.

The directory is root's, mode 0700, and never followed through a link."""
from __future__ import annotations

import fcntl
import os
import stat
import time

from ..model import UstackError
from ..output import lock_file_at, private_directory

GROUP_PREFIX = "ustack_"
LOCK_DIR = "/run/ustack"
INIT_PID_NS_INO = 0xEFFFFFFC        # PROC_PID_INIT_INO: the initial pid namespace
HOLD_WAIT_S = 10.0                  # longer than a guardian may take to clear a name

_FILE_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK

_names: dict = {}                   # pid -> tracing name (a fork has its own)
_held: dict = {}                    # pid -> [lock fd, users]


def pid_namespace_inode(pid: str = "self") -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def tracing_name() -> str:
    """This process's name for its ftrace instance and uprobe group."""
    pid = os.getpid()
    name = _names.get(pid)
    if name is None:
        ns = pid_namespace_inode()
        name = (f"{GROUP_PREFIX}{pid}" if ns == INIT_PID_NS_INO
                else f"{GROUP_PREFIX}{pid}_{ns or 0}")
        _names[pid] = name
    return name


def _lock_dir() -> int | None:
    """An fd of LOCK_DIR, made if missing; None when it is not a real
    directory that only its owner, root (or we), can write."""
    return private_directory(LOCK_DIR, create=True)


def _is_current(fd: int, name: str, dir_fd: int) -> bool:
    """Whether `fd` is still the file at LOCK_DIR/name (a cleanup that
    proved the name dead unlinks it while holding its lock)."""
    try:
        here = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def hold() -> int | None:
    """Take this process's lock (again: counted); its fd, or None if the
    lock directory cannot be used (the run goes on, and no cleanup can
    prove it dead). Call before making anything under tracing_name().
    UstackError if the guardian of a killed process that had our pid
    still clears the name after HOLD_WAIT_S."""
    pid = os.getpid()
    if pid in _held:
        _held[pid][1] += 1
        return _held[pid][0]
    dir_fd = _lock_dir()
    if dir_fd is None:
        return None
    name = tracing_name()
    try:
        while True:
            fd = lock_file_at(dir_fd, name)
            if fd is None:
                return None
            # held only while a cleanup or the guardian of a dead process
            # that had our pid clears the name: they unlink it when done
            if not _wait_lock(fd):
                os.close(fd)
                raise UstackError(f"{LOCK_DIR}/{name} stays locked by another process: "
                                  "a run of this name is still being cleared")
            if _is_current(fd, name, dir_fd):
                _held[pid] = [fd, 1]
                return fd
            os.close(fd)
    finally:
        os.close(dir_fd)


def _wait_lock(fd: int, timeout: float = HOLD_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def release() -> None:
    """Drop one hold(); the last one removes the lock file (the guardian,
    if any, holds the lock until it exits)."""
    entry = _held.get(os.getpid())
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        del _held[os.getpid()]
        forget(tracing_name(), entry[0])


def lock_if_dead(name: str) -> int | None:
    """The lock of run `name` if nobody holds it (the run and its guardian
    are gone): an fd to pass to forget() once its tracing is removed.
    None if the run is alive, or cannot be proven dead."""
    dir_fd = _lock_dir()
    if dir_fd is None:
        return None
    try:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError:
            return None
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _is_current(fd, name, dir_fd):
                    return fd
        except OSError:
            pass                        # held: alive
        os.close(fd)
        return None
    finally:
        os.close(dir_fd)


def forget(name: str, fd: int) -> None:
    """Remove LOCK_DIR/name if it is still the file `fd` holds locked, and
    close it."""
    dir_fd = _lock_dir()
    try:
        if dir_fd is not None and _is_current(fd, name, dir_fd):
            os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
        os.close(fd)


def lock_names() -> list:
    """The names that have a lock file (live runs', and dead ones' not yet
    cleared)."""
    try:
        return [n for n in os.listdir(LOCK_DIR) if n.startswith(GROUP_PREFIX)]
    except OSError:
        return []
