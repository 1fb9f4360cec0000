"""Where a report goes: `-o FILE` or standard output, in the format asked
for (`-f`) or implied by the file's name."""
from __future__ import annotations

import contextlib
import io
import os
import sys

from ..model import UstackError
from ..output import Output, check_destination
from .formats import EXTENSIONS, format_for_path


def choose_format(asked: str | None, path: str | None, table: dict,
                  default: str = "text") -> str:
    """-f wins; else the ending of -o's file name; else `default` for a
    name without an ending. A name whose ending ustack does not write
    (out.png, run.data) is refused, never filled with another format."""
    if asked:
        if asked not in table:
            raise UstackError(f"format {asked!r} is not available here "
                              f"(one of {', '.join(table)})")
        return asked
    implied = format_for_path(path) if path and path != "-" else None
    if implied is None:
        ending = _ending(path) if path and path != "-" else ""
        if ending:
            endings = ", ".join(e for e, name in EXTENSIONS.items() if name in table)
            if len(table) == 1:        # no -f to choose with (latency, report --diff)
                raise UstackError(f"-o {path}: ustack writes no {ending} file here; it "
                                  f"writes {next(iter(table))}: end the name with "
                                  f"{endings}, or give it no ending")
            raise UstackError(f"-o {path}: ustack writes no {ending} file here; end the "
                              f"name with {endings}, or say which with -f "
                              f"({', '.join(table)})")
        return default
    if implied not in table:
        raise UstackError(f"-o {path}: {implied} is not a format of this command "
                          f"(one of {', '.join(table)}; or say which with -f)")
    return implied


def _ending(path: str) -> str:
    """The `.png` of out.png; '' for a name without one (out, .hidden)."""
    stem, dot, ending = os.path.basename(path).rpartition(".")
    return dot + ending if stem and ending else ""


@contextlib.contextmanager
def open_output(path: str | None, binary: bool = False, whole: bool = True):
    """A stream for the report: the file at `path` (written as output.py
    writes every file), else stdout. `whole`: the file appears when the
    report is finished, never half-written; a stream of events (trace) is
    written as it comes instead. A binary format is refused on a terminal."""
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
    label = f"-o {path}"
    check_destination(path, label)
    target = Output(path, label, whole=whole)
    stream = (target.file if binary else
              io.TextIOWrapper(target.file, encoding="utf-8", newline=""))
    try:
        out = _Checked(stream, label)
        yield out
        out.flush()                 # its error said here, not at close
        if not binary:
            stream.detach()
        target.commit()
    except BaseException:
        if not binary:
            with contextlib.suppress(OSError, ValueError):   # said already
                stream.detach()
        target.discard()
        raise


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
