"""The sender's bounded on-disk queue: an interval waits here as one file
until the server has it, so a server down or slow loses nothing and the
sampling never waits for it. Written only through output.py, in a
private directory (0700, not a link, owned by the user), locked by the one
run that uses it. Past its bound the OLDEST intervals are dropped first
(the recent past matters most to whoever looks now), and counted."""
from __future__ import annotations

import fcntl
import os
import threading

from ...model import UstackError
from ...output import lock_file_at, private_directory, write_bytes_at

SUFFIX = ".json"
DEFAULT_QUEUE_BYTES = 64 << 20


class Spool:
    def __init__(self, directory: str, limit_bytes: int = DEFAULT_QUEUE_BYTES):
        self.directory, self.limit = directory, limit_bytes
        fd = private_directory(directory, create=True)
        if fd is None:
            raise UstackError(f"--queue {directory}: not a private directory of this "
                              "user (0700, not a link): name another")
        self.fd = fd
        self._lock = lock_file_at(fd, "lock")
        try:
            if self._lock is None:
                raise BlockingIOError
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.close()
            raise UstackError(f"--queue {directory} is in use by another ustack: "
                              "give each agent its own (--queue DIR)") from None
        self.guard = threading.Lock()   # put() and the sender's remove()
        self.dropped = 0            # intervals dropped past the bound
        self.dropped_bytes = 0

    def names(self) -> list:
        """The queued intervals, oldest first (names sort in time)."""
        return sorted(n for n in os.listdir(self.fd) if n.endswith(SUFFIX))

    def size(self) -> int:
        total = 0
        for name in self.names():
            try:
                total += os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size
            except FileNotFoundError:
                pass
        return total

    def put(self, name: str, data) -> None:
        """Queue one interval (bytes, or a list of them: its file's parts
        in order, not joined first); past the bound, drop the oldest to
        make room."""
        with self.guard:
            self._put(name, [data] if isinstance(data, bytes) else data)

    def _put(self, name: str, parts: list) -> None:
        size = sum(map(len, parts))
        over = self.size() + size - self.limit
        for old in self.names():
            if over <= 0:
                break
            size = self._drop(old)
            over -= size
        if over > 0:                 # this one alone is over the bound
            self.dropped += 1
            self.dropped_bytes += size
            return
        write_bytes_at(self.fd, name + SUFFIX, parts)

    def _drop(self, name: str) -> int:
        try:
            size = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_size
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return 0                 # the sender had it meanwhile
        self.dropped += 1
        self.dropped_bytes += size
        return size

    def read(self, name: str) -> bytes | None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def remove(self, name: str) -> None:
        with self.guard:
            try:
                os.unlink(name, dir_fd=self.fd)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
