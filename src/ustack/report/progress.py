"""The live status line of a long run (stderr, when it is a terminal):
elapsed time, events, events/s and losses, redrawn in place about once a
second; and the count of events seen, so a run that saw none can say so."""
from __future__ import annotations

import time
from collections.abc import Callable
from io import TextIOBase

REDRAW_S = 1.0


class Progress:
    """`piece(p)` for each piece of the stream; `finish()` clears the line.
    `losses`: a function giving the run's Losses so far (cheap to call)."""

    def __init__(self, err: TextIOBase, live: bool,
                 losses: Callable | None = None, counted_in_kernel: bool = False):
        self.err = err
        self.live = live
        self.losses = losses
        self.counted_in_kernel = counted_in_kernel   # samples never reach us
        self.seen = 0                      # samples that reached the stream
        self._start = self._next = time.monotonic()
        self._drawn = False

    def piece(self, piece) -> None:
        self.seen += len(piece.samples)
        if self.live:
            now = time.monotonic()
            if now >= self._next:
                self._next = now + REDRAW_S
                self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self._start
        if self.counted_in_kernel:
            text = f"{elapsed:.0f} s, counting in the kernel"
        else:
            rate = self.seen / elapsed if elapsed > 0 else 0
            text = f"{elapsed:.0f} s, {self.seen:,} events, {rate:,.0f}/s"
        if self.losses is not None:
            lost = self.losses().lost
            if lost:
                text += f", {lost:,} lost"
        self.err.write(f"\r\x1b[K[ustack] {text}")
        self.err.flush()
        self._drawn = True

    def finish(self) -> None:
        if self._drawn:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._drawn = False

    def stop(self) -> None:
        """Clear the line and draw it no more: results are about to be
        written, on the same terminal maybe, and must not land on it."""
        self.finish()
        self.live = False

    def guard(self, stream):
        """`stream`, stopping the status line at its first write when it
        goes to a terminal (a file takes its lines while the status runs)."""
        isatty = getattr(stream, "isatty", None)
        on_terminal = isatty is not None and isatty()
        return _StopsProgress(stream, self) if self.live and on_terminal else stream


class _StopsProgress:
    def __init__(self, stream, progress: Progress):
        self._stream, self._progress = stream, progress

    def write(self, data):
        if self._progress.live:
            self._progress.stop()
        return self._stream.write(data)

    def __getattr__(self, name):
        return getattr(self._stream, name)
