"""Where a report goes: `-o FILE` or standard output, in the format asked
for (`-f`) or implied by the file's name."""
from __future__ import annotations

import contextlib
import io
import os
import sys

from ..model import UstackError
from ..output import Output, WholeWrites
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


class open_output:
    """A stream for the report: the file at `path` (written as output.py
    writes every file: it appears when the report is finished, never
    half-written, a stream of events (trace) too), else stdout. The file is
    opened when this is made, so a run makes it before it arms anything
    (a refusal comes first, a FIFO nobody reads is never waited on); `with`
    it gives the stream, keeps the file at a normal end and drops it on an
    error. discard(): drop it when the `with` never came (the run failed
    first); harmless after. A binary format is refused on a terminal.
    Standard output is written through output.WholeWrites, which writes
    all it is given when a write to a pipe returns short."""

    def __init__(self, path: str | None, binary: bool = False):
        self._binary = binary
        self._target = None
        if path is None or path == "-":
            if binary and sys.stdout.isatty():
                raise UstackError("this format is binary: write it to a file "
                                  "with -o FILE (or redirect stdout)")
            self._label = "stdout"
            return
        self._label = f"-o {path}"
        self._target = Output(path, self._label)

    def __enter__(self):
        if self._target is None:
            self._stream, self._wrapped = _stdout(self._binary)
        elif self._binary:
            self._stream = self._target.file
        else:
            self._stream = io.TextIOWrapper(self._target.file, encoding="utf-8",
                                            newline="")
        self._out = _Checked(self._stream, self._label)
        return self._out

    def __exit__(self, exc_type, exc, tb):
        if self._target is None:
            # a text wrapper of ours over stdout's descriptor: detached, not closed
            detach = self._stream.detach if self._wrapped and not self._binary else None
            if exc_type is None:
                self._out.flush()
                if detach is not None:
                    detach()                # stdout stays open
            else:                           # what was written goes out still
                with contextlib.suppress(OSError, ValueError):   # said already
                    self._stream.flush()
                    if detach is not None:
                        detach()
            return False
        if exc_type is None:
            try:
                self._out.flush()              # its error said here, not at close
            except BaseException:
                self._drop_stream()
                raise
            if not self._binary:
                self._stream.detach()
            self._target.commit()
            return False
        self._drop_stream()
        return False

    def _drop_stream(self) -> None:
        if not self._binary:
            with contextlib.suppress(OSError, ValueError):   # said already
                self._stream.detach()
        self.discard()

    def discard(self) -> None:
        if self._target is not None:
            self._target.discard()


def _stdout(binary: bool) -> tuple:
    """(standard output as the report's stream, whether it is ours): through
    WholeWrites on its descriptor (text: in stdout's encoding, line by line
    on a terminal and each write at once unbuffered, as stdout is), or
    sys.stdout itself where it has none (a caller that replaced it, an
    in-process run's test)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):   # io.UnsupportedOperation included
        return (sys.stdout.buffer if binary else sys.stdout), False
    sys.stdout.flush()                  # what was printed before comes first
    # as stdout was: each write out at once on a terminal or unbuffered
    # (PYTHONUNBUFFERED, -u: a trace's events reach a pipe as they come)
    at_once = sys.stdout.isatty() or sys.stdout.write_through
    raw = WholeWrites(fd, own=False, at_once=at_once)
    if binary:
        return raw, True
    return io.TextIOWrapper(raw, encoding=sys.stdout.encoding, errors=sys.stdout.errors,
                            line_buffering=sys.stdout.line_buffering,
                            write_through=sys.stdout.write_through), True


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
