"""The one way ustack writes a file: reports, recordings, archives, caches.

ustack runs as root, often in directories others can write (/tmp), so a
name it writes may have been planted. Here:
- the directory of the destination is opened once and everything else
  is done relative to that descriptor (its parents are the user's choice);
- a symbolic link at the name is refused, never followed;
- a whole file is written under an unpredictable temporary name (created
  O_EXCL|O_NOFOLLOW, no wider mode than the final file's) and renamed
  into place only over nothing or a regular file;
- a device, FIFO or socket at the name (-o /dev/null) is written in place,
  never replaced by a regular file;
- every write error, at write, flush, close or rename, is one line naming
  the file (UstackError), and the temporary file is removed."""
from __future__ import annotations

import contextlib
import errno
import os
import stat

from .model import UstackError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_NAME = 200                 # room for the temporary suffix within NAME_MAX


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def split(path: str, label: str) -> tuple:
    """(directory, final name) of `path`; refuses a path that names a directory."""
    directory, name = os.path.split(os.fspath(path))
    if name in ("", ".", ".."):
        raise UstackError(f"{label} is a directory, not a file")
    return directory or ".", name


def open_directory(directory: str, label: str, nofollow: bool = False) -> int:
    """A descriptor of `directory`, the one every later step works in.
    `nofollow`: the directory itself must not be a link (one ustack made)."""
    try:
        return os.open(directory, _DIR_FLAGS | (os.O_NOFOLLOW if nofollow else 0))
    except (FileNotFoundError, NotADirectoryError):
        raise UstackError(f"{label}: no such directory "
                          f"{os.path.abspath(directory)}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UstackError(f"{label}: {directory} is a symbolic link; "
                              "ustack does not write through links") from None
        raise UstackError(f"{label}: {_why(e)}") from None


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """What is at `name` in the directory (a link itself, not its target)."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def refuse_kind(st: os.stat_result | None, label: str, what: str = "a file") -> None:
    """The names ustack never writes: a link, a directory."""
    if st is None:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UstackError(f"{label} is a symbolic link; ustack does not write "
                          "through links (remove it or name another file; "
                          "-o - writes to standard output)")
    if stat.S_ISDIR(st.st_mode):
        raise UstackError(f"{label} is a directory, not {what}")


def check_destination(path: str, label: str = "", what: str = "a file") -> None:
    """Refuse, before a run starts rather than after it, a path ustack will
    write: its directory must exist, and the name must not be a directory
    or a link. `label` starts the message (default: the path)."""
    label = label or path
    directory, name = split(path, label)
    dir_fd = open_directory(directory, label)
    try:
        refuse_kind(lstat_at(dir_fd, name), label, what)
    except OSError as e:
        raise UstackError(f"{label}: {_why(e)}") from None
    finally:
        os.close(dir_fd)


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
    a regular file (a link or device put there meanwhile stays)."""
    st = lstat_at(dir_fd, name)
    if st is not None and not stat.S_ISREG(st.st_mode):
        refuse_kind(st, label)
        raise UstackError(f"{label} is no longer a regular file; not replaced")
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


class Output:
    """A file being written at `path`: `.file`, a binary file object; then
    commit() (flush, close, and for a whole file the rename into place) or
    discard(). `whole`: the file appears only when finished (a temporary
    name until then); otherwise it is written as things come (trace -o),
    which a device or FIFO always is. `mode`: of a new file (the umask
    applies); a file replaced keeps no wider mode than it had."""

    def __init__(self, path: str, label: str | None = None, whole: bool = True,
                 mode: int = 0o666):
        self.path = os.fspath(path)
        self.label = label or self.path
        directory, self._name = split(self.path, self.label)
        self._dir = open_directory(directory, self.label)
        self._tmp = None
        self.file = None
        try:
            fd = self._open(whole, mode)
            self.file = os.fdopen(fd, "wb")
        except OSError as e:
            self._close_dir()
            raise UstackError(f"{self.label}: {_why(e)}") from None
        except BaseException:
            self._close_dir()
            raise

    def _open(self, whole: bool, mode: int) -> int:
        name, dir_fd = self._name, self._dir
        st = lstat_at(dir_fd, name)
        refuse_kind(st, self.label)
        if st is not None and not stat.S_ISREG(st.st_mode):
            # a device, FIFO or socket: written in place, never replaced
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise UstackError(f"{self.label} changed while it was opened")
            return fd
        if st is not None:
            mode &= st.st_mode & 0o777
        if whole:
            fd, self._tmp = new_temporary(dir_fd, name, mode)
            return fd
        return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                       | os.O_CLOEXEC, mode, dir_fd=dir_fd)

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
        """Close without keeping anything (a whole file is not written)."""
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
    locks) to trust: not a link, and writable only by its owner, the
    running user or root; None otherwise. `create`: made 0700 (with its
    parents) when missing."""
    if create:
        try:
            os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        return None
    return fd
