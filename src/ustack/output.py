"""The one way ustack writes a file: reports, recordings, archives, caches.

ustack runs as root, often in directories others can write (/tmp), so a
name it writes, or a directory on the way to it, may have been planted.
Here:
- the directory of the destination is reached one component at a time
  (openat with O_NOFOLLOW): a symbolic link on the way is followed only as
  the kernel's protected_symlinks rule allows, whatever that sysctl says
  (in a sticky world-writable directory, only a link of the runner or of
  the directory's owner); everything else is done relative to that
  directory's descriptor;
- a symbolic link at the name is refused, never followed;
- a file is always written new, under an unpredictable temporary name
  (created O_EXCL|O_NOFOLLOW, no wider mode than the final file's) and
  renamed into place when finished, only over nothing or a regular file
  the runner owns: an existing file (a hard link planted there, another
  user's file) is never written into;
- a FIFO or device at the name is written in place only when it is the
  runner's or root's (-o /dev/null; the standard streams by their names,
  -o /dev/stdout), opened without blocking: a FIFO nobody reads is
  refused at once, not waited for; a socket is refused;
- every write error, at write, flush, close or rename, is one line naming
  the file (UstackError), and the temporary file is removed."""
from __future__ import annotations

import collections
import contextlib
import errno
import io
import os
import re
import stat

from .model import UstackError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_NAME = 200                 # room for the temporary suffix within NAME_MAX
_MAX_LINKS = 40                 # the kernel's own limit on links in one path
# the standard streams (and descriptors the shell passed, >(cmd)) by name
_STREAM_NAMES = {"/dev/stdout": 1, "/dev/stderr": 2}
_FD_NAME = re.compile(r"/(?:dev|proc/self)/fd/(\d+)")


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def split(path: str, label: str) -> tuple:
    """(directory, final name) of `path`; refuses a path that names a directory."""
    directory, name = os.path.split(os.fspath(path))
    if name in ("", ".", ".."):
        raise UstackError(f"{label} is a directory, not a file")
    return directory or ".", name


def stream_descriptor(path: str) -> int | None:
    """The descriptor `path` names when it names one of the run's own
    (/dev/stdout, /dev/stderr, /dev/fd/N): written as that descriptor."""
    path = os.fspath(path)
    if path in _STREAM_NAMES:
        return _STREAM_NAMES[path]
    named = _FD_NAME.fullmatch(path)
    return int(named.group(1)) if named else None


def _may_follow(dir_fd: int, link: os.stat_result) -> bool:
    """The kernel's protected_symlinks rule: a link in a sticky
    world-writable directory is followed only when it is the follower's
    or the directory owner's (anyone could have planted it there)."""
    d = os.fstat(dir_fd)
    if not (d.st_mode & stat.S_ISVTX and d.st_mode & stat.S_IWOTH):
        return True
    return link.st_uid in (os.geteuid(), d.st_uid)


def walk_directory(directory: str, label: str, follow_last: bool = True,
                   create_mode: int | None = None) -> int:
    """An O_PATH descriptor of `directory`, reached one component at a time
    without letting the kernel follow a link: each link on the way is read
    and followed here, when _may_follow allows. `follow_last`: the
    directory itself may be a link. `create_mode`: missing components are
    made with this mode. Raises OSError (ELOOP for a link not followed)
    or UstackError."""
    parts = collections.deque(os.fspath(directory).split("/"))
    fd = os.open("/" if directory.startswith("/") else ".", _PATH_DIR)
    walked = "/" if directory.startswith("/") else ""
    links = 0
    try:
        while parts:
            part = parts.popleft()
            if part in ("", "."):
                continue
            try:
                child = os.open(part, _PATH_DIR, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, create_mode, dir_fd=fd)
                parts.appendleft(part)
                continue
            except OSError as e:
                if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise
                shown = os.path.join(walked, part)
                if not follow_last and all(p in ("", ".") for p in parts):
                    raise OSError(errno.ELOOP, "a symbolic link", shown) from None
                if not _may_follow(fd, st):
                    raise UstackError(
                        f"{label}: {shown} is a symbolic link of another user "
                        f"(uid {st.st_uid}) in a sticky world-writable directory; "
                        "ustack does not follow it") from None
                links += 1
                if links > _MAX_LINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown) from None
                target = os.readlink(part, dir_fd=fd)
                parts.extendleft(reversed(target.split("/")))
                if target.startswith("/"):
                    os.close(fd)
                    fd = os.open("/", _PATH_DIR)
                    walked = "/"
                continue
            os.close(fd)
            fd = child
            walked = os.path.join(walked, part)
        return fd
    except BaseException:
        os.close(fd)
        raise


def open_directory(directory: str, label: str, nofollow: bool = False) -> int:
    """A descriptor of `directory`, the one every later step works in,
    reached as walk_directory reaches it. `nofollow`: the directory itself
    must not be a link (one ustack made)."""
    try:
        path_fd = walk_directory(directory, label, follow_last=not nofollow)
    except (FileNotFoundError, NotADirectoryError):
        raise UstackError(f"{label}: no such directory "
                          f"{os.path.abspath(directory)}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UstackError(f"{label}: {directory} is a symbolic link; "
                              "ustack does not write through links") from None
        raise UstackError(f"{label}: {_why(e)}") from None
    try:
        return os.open(".", _DIR_FLAGS, dir_fd=path_fd)
    except OSError as e:
        raise UstackError(f"{label}: {_why(e)}") from None
    finally:
        os.close(path_fd)


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """What is at `name` in the directory (a link itself, not its target)."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device"


def refuse_kind(st: os.stat_result | None, label: str, what: str = "a file") -> None:
    """The names ustack never writes: a link, a directory, a socket, and
    anything of another user (a regular file is replaced only when it is
    the runner's; a FIFO or device is written only when it is the
    runner's or root's)."""
    if st is None:
        return
    mode, uid = st.st_mode, st.st_uid
    if stat.S_ISLNK(mode):
        raise UstackError(f"{label} is a symbolic link; ustack does not write "
                          "through links (remove it or name another file; "
                          "-o - writes to standard output)")
    if stat.S_ISDIR(mode):
        raise UstackError(f"{label} is a directory, not {what}")
    if stat.S_ISREG(mode):
        if uid != os.geteuid():
            raise UstackError(f"{label} is a file of another user (uid {uid}); "
                              "ustack does not replace it (remove it or name "
                              "another file)")
        return
    if stat.S_ISSOCK(mode):
        raise UstackError(f"{label} is a socket, not {what}")
    if uid not in (os.geteuid(), 0):
        raise UstackError(f"{label} is {_kind(mode)} of another user (uid {uid}); "
                          "ustack does not write to it")


def check_destination(path: str, label: str = "", what: str = "a file") -> None:
    """Refuse, before a run starts rather than after it, a path ustack will
    write: its directory must be reachable as walk_directory allows, and
    the name must not be what refuse_kind refuses. `label` starts the
    message (default: the path)."""
    label = label or path
    if stream_descriptor(path) is not None:
        return
    directory, name = split(path, label)
    dir_fd = open_directory(directory, label)
    try:
        refuse_kind(lstat_at(dir_fd, name), label, what)
    except OSError as e:
        raise UstackError(f"{label}: {_why(e)}") from None
    finally:
        os.close(dir_fd)


def open_node(dir_fd: int, name: str, label: str, what: str = "a file") -> int:
    """A descriptor to write the FIFO or device `name` in place: looked at
    through O_PATH first (opening a device can act), then opened without
    blocking, so a FIFO nobody reads is refused at once."""
    path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(path_fd)
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
            raise UstackError(f"{label} changed while it was opened")
        refuse_kind(st, label, what)
        try:
            fd = os.open(f"/proc/self/fd/{path_fd}",
                         os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except OSError as e:
            if e.errno == errno.ENXIO and stat.S_ISFIFO(st.st_mode):
                raise UstackError(f"{label} is a FIFO nobody reads; ustack does "
                                  "not wait for a reader (start it first)") from None
            raise
    finally:
        os.close(path_fd)
    os.set_blocking(fd, True)          # a reader that is slow is waited for
    return fd


def new_temporary(dir_fd: int, name: str, mode: int) -> tuple:
    """(fd, name) of a new empty file beside `name`, its name unguessable."""
    for _ in range(100):
        tmp = f".{name[:_MAX_NAME]}.{os.urandom(8).hex()}.tmp"
        try:
            return os.open(tmp, _NEW, mode, dir_fd=dir_fd), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no free temporary name")


def replace_at(dir_fd: int, tmp: str, name: str, label: str) -> None:
    """Rename `tmp` to `name`, both in the directory: only over nothing or
    a regular file of the runner (a link, device or another user's file
    put there meanwhile stays)."""
    st = lstat_at(dir_fd, name)
    if st is not None and not stat.S_ISREG(st.st_mode):
        refuse_kind(st, label)
        raise UstackError(f"{label} is no longer a regular file; not replaced")
    refuse_kind(st, label)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class Output:
    """A file being written at `path`: `.file`, a binary file object; then
    commit() (flush, close, and for a file the rename into place) or
    discard(). Everything is opened here, so a caller makes it before a run
    arms anything and refusals come before the run. A regular file is
    always written new under a temporary name and appears only at commit,
    a stream of events (trace -o) too; a FIFO or device the runner may
    write is written in place. `mode`: of a new file (the umask applies); a
    file replaced keeps no wider mode than it had."""

    def __init__(self, path: str, label: str | None = None, mode: int = 0o666,
                 what: str = "a file"):
        self.path = os.fspath(path)
        self.label = label or self.path
        self._dir = None
        self._tmp = None
        self.file = None
        stream = stream_descriptor(self.path)
        if stream is not None:
            try:
                self.file = WholeWrites(os.dup(stream))
            except OSError as e:
                raise UstackError(f"{self.label}: {_why(e)}") from None
            return
        directory, self._name = split(self.path, self.label)
        self._dir = open_directory(directory, self.label)
        try:
            fd = self._open(mode, what)
            self.file = os.fdopen(fd, "wb")
        except OSError as e:
            self.discard()
            raise UstackError(f"{self.label}: {_why(e)}") from None
        except BaseException:
            self.discard()
            raise

    def _open(self, mode: int, what: str) -> int:
        name, dir_fd = self._name, self._dir
        st = lstat_at(dir_fd, name)
        refuse_kind(st, self.label, what)
        if st is not None and not stat.S_ISREG(st.st_mode):
            return open_node(dir_fd, name, self.label, what)
        if st is not None:
            mode &= st.st_mode & 0o777
        fd, self._tmp = new_temporary(dir_fd, name, mode)
        return fd

    def commit(self) -> None:
        """Finish the file; any failure is a UstackError and leaves no
        temporary file behind."""
        try:
            try:
                self.file.close()
            except OSError as e:
                raise UstackError(f"{self.label}: {_why(e)}") from None
            if self._tmp is not None:
                try:
                    replace_at(self._dir, self._tmp, self._name, self.label)
                except OSError as e:
                    raise UstackError(f"{self.label}: {_why(e)}") from None
                self._tmp = None
        finally:
            self.discard()

    def discard(self) -> None:
        """Close without keeping anything (the file is not written); may be
        called again, and after commit()."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                self.file.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp, dir_fd=self._dir)
            self._tmp = None
        self._close_dir()

    def _close_dir(self) -> None:
        if self._dir is not None:
            os.close(self._dir)
            self._dir = None


def write_bytes_at(dir_fd: int, name: str, chunks, mode: int = 0o600) -> None:
    """Put the bytes of `chunks` at `name` in the directory whole (a
    concurrent reader sees the old file or the new one); raises OSError or
    UstackError."""
    fd, tmp = new_temporary(dir_fd, name, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        replace_at(dir_fd, tmp, name, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def make_directory(path: str, label: str, mode: int = 0o755) -> int:
    """Create the directory `path` (it must not exist: ustack fills only a
    directory it made itself) and return a descriptor of it."""
    parent, name = split(path, label)
    parent_fd = open_directory(parent, label)
    try:
        try:
            os.mkdir(name, mode, dir_fd=parent_fd)
        except FileExistsError:
            raise UstackError(f"{label} exists already: remove it or name "
                              "another directory") from None
        except OSError as e:
            raise UstackError(f"{label}: {_why(e)}") from None
        return _open_child(parent_fd, name, label)
    finally:
        os.close(parent_fd)


def _open_child(parent_fd: int, name: str, label: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent_fd)
    except OSError as e:
        raise UstackError(f"{label}: {_why(e)}") from None


def subdirectory(dir_fd: int, name: str, label: str, mode: int = 0o755) -> int:
    """A directory `name` in a directory ustack made (created when missing),
    opened without following a link."""
    try:
        os.mkdir(name, mode, dir_fd=dir_fd)
    except FileExistsError:
        pass
    except OSError as e:
        raise UstackError(f"{label}: {_why(e)}") from None
    return _open_child(dir_fd, name, label)


def lock_file_at(dir_fd: int, name: str) -> int | None:
    """A descriptor of the lock file `name` in the directory (created 0600
    when missing, never through a link; its content is never written), or
    None when it is not a regular file or cannot be had."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK, 0o600, dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def private_directory(directory: str, create: bool = False) -> int | None:
    """A descriptor of a directory of ustack's own state (caches, run
    locks) to trust: reached as walk_directory reaches it, not a link, and
    writable only by its owner, the running user or root; None otherwise.
    `create`: made 0700 (with its parents) when missing."""
    try:
        path_fd = walk_directory(directory, directory, follow_last=False,
                                 create_mode=0o700 if create else None)
    except (OSError, UstackError):
        return None
    try:
        fd = os.open(".", _DIR_FLAGS, dir_fd=path_fd)
    except OSError:
        return None
    finally:
        os.close(path_fd)
    st = os.fstat(fd)
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        return None
    return fd


class WholeWrites(io.BufferedIOBase):
    """A binary stream over a descriptor ustack did not create the file of
    (standard output, a FIFO or device given with -o) that writes all it
    is given. A write(2) to a pipe returns short when a signal or a fork
    comes while it waits for the reader (a -c command's SIGCHLD, a
    builder started by another thread); Python's unbuffered stdout
    (PYTHONUNBUFFERED, -u: a raw FileIO under the text layer) dropped the
    rest: measured, 8-13 KB of a trace's 935 KB to a slow reader in 6 of
    160 runs; 0.2-2 % of a 10 MB stream while another thread started
    processes (CPython 3.11-3.13; none with stdout buffered). Buffered up
    to `size` bytes, or written at each write where `at_once` (default:
    on a terminal, as a line-buffered stdout shows each event)."""

    def __init__(self, fd: int, *, own: bool = True, size: int = io.DEFAULT_BUFFER_SIZE,
                 at_once: bool | None = None):
        super().__init__()
        self._fd, self._own, self._size = fd, own, size
        self._pending = bytearray()
        self._tty = os.isatty(fd)
        self._at_once = self._tty if at_once is None else at_once

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return self._tty

    def write(self, data) -> int:
        if self.closed:
            raise ValueError("write to a closed stream")
        n = memoryview(data).nbytes
        if not self._pending and (n >= self._size or self._at_once):
            self._write_all(data)           # no copy for a big write
            return n
        self._pending += data
        if len(self._pending) >= self._size or self._at_once:
            self.flush()
        return n

    def flush(self) -> None:
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            self._write_all(data)

    def _write_all(self, data) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self._fd, view):]     # EINTR: retried by os.write

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
        finally:
            if self._own:
                os.close(self._fd)
            super().close()
