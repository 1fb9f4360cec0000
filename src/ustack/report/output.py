"""Where a report goes: `-o FILE` or standard output, in the format asked
for (`-f`) or implied by the file's name."""
from __future__ import annotations

import contextlib
import os
import stat
import sys

from ..model import UstackError
from .formats import format_for_path


def choose_format(asked: str | None, path: str | None, table: dict,
                  default: str = "text") -> str:
    """-f wins; else the ending of -o's file name; else `default`."""
    if asked:
        if asked not in table:
            raise UstackError(f"format {asked!r} is not available here "
                              f"(one of {', '.join(table)})")
        return asked
    implied = format_for_path(path) if path else None
    if implied is None:
        return default
    if implied not in table:
        raise UstackError(f"-o {path}: {implied} is not a format of this command "
                          f"(one of {', '.join(table)}; or say which with -f)")
    return implied


def check_destination(path: str, label: str = "", what: str = "a file") -> None:
    """Refuse a path ustack will write before the run starts, not after:
    its directory must exist and it must not be one. `label` starts the
    message (default: the path)."""
    label = label or path
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UstackError(f"{label}: no such directory {directory}")
    if os.path.isdir(path):
        raise UstackError(f"{label} is a directory, not {what}")


@contextlib.contextmanager
def open_output(path: str | None, binary: bool = False, whole: bool = True):
    """A stream for the report: the file at `path`, else stdout. `whole`:
    the file appears when the report is finished (a temporary name until
    then), never half-written; a stream of events (trace) is written as it
    comes instead. A binary format is refused on a terminal."""
    if path is None or path == "-":
        if binary:
            if sys.stdout.isatty():
                raise UstackError("this format is binary: write it to a file "
                                  "with -o FILE (or redirect stdout)")
            out = _Checked(sys.stdout.buffer, "stdout")
        else:
            out = _Checked(sys.stdout, "stdout")
        yield out
        out.flush()
        return
    check_destination(path, f"-o {path}")
    # a device or FIFO (-o /dev/null) is written in place: renaming a
    # finished file over it would replace the device node itself
    whole = whole and not _special(path)
    partial = f"{path}.partial-{os.getpid()}" if whole else path
    try:
        stream = open(partial, "wb" if binary else "w",
                      **({} if binary else {"encoding": "utf-8", "newline": ""}))
    except OSError as e:
        raise UstackError(f"-o {path}: {e.strerror}") from None
    try:
        out = _Checked(stream, f"-o {path}")
        try:
            yield out
            out.flush()                 # its error said here, not at close
        finally:
            with contextlib.suppress(OSError):   # a failed flush is said already
                stream.close()
        if whole:
            try:
                os.replace(partial, path)
            except OSError as e:
                raise UstackError(f"-o {path}: {e.strerror}") from None
    except BaseException:
        if whole:
            with contextlib.suppress(OSError):
                os.unlink(partial)
        raise


def _special(path: str) -> bool:
    """Whether `path` exists and is not a regular file."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class _Checked:
    """A report stream whose write errors (a full disk, -o /dev/full) end
    the run with a one-line error, not a traceback."""

    def __init__(self, stream, label: str):
        self._stream = stream
        self._label = label

    def write(self, data):
        try:
            return self._stream.write(data)
        except BrokenPipeError:
            raise                        # the reader left (| head): not an error
        except OSError as e:
            raise UstackError(f"{self._label}: {e.strerror}") from None

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise UstackError(f"{self._label}: {e.strerror}") from None

    def __getattr__(self, name):
        return getattr(self._stream, name)
