"""`ustack top`: a profile shown live, the hottest functions refreshed
every second (perf top, py-spy top). The run is profile's (run_session,
Session.interval_counts); on a terminal the table fills the screen, keys
sort it as top(1)'s do and q or Ctrl-C ends it; otherwise a plain
snapshot is printed per refresh."""
from __future__ import annotations

import os
import select
import sys
import termios
import threading
import time
import tty

from .run import run_session
from ..model import UstackError
from ..options import check_frequency, run_options
from ..report.top import FunctionTable, format_header, format_rows
from ..session import Session

REFRESH_S = 1.0
KEY_POLL_S = 0.1                # how soon the key reader hears the run end
PLAIN_ROWS = 20                 # rows of a snapshot printed to a pipe or file
# the keys that sort the table: ours, and top(1)'s for the same order
# (P: %CPU, T: TIME+, N: PID)
SORT_KEYS = {"s": "self", "P": "self", "t": "total", "T": "total",
             "f": "function", "p": "pid", "N": "pid"}
KEYS_HINT = "s t f p: sort by self, total, function, pid; q or Ctrl-C: quit"


def main(args) -> int:
    """`ustack top` from its parsed arguments."""
    opts = run_options(args)
    check_frequency(args.frequency)
    if args.rows is not None and args.rows <= 0:
        raise UstackError("--rows must be a positive number")
    opts.command = "profile"            # a profile, only shown differently
    opts.events = [f"profile:hz:{args.frequency}"]
    out = sys.stdout
    keys_read = out.isatty() and sys.stdin is not None and sys.stdin.isatty()
    view = (Screen(out, args.rows, KEYS_HINT if keys_read else "Ctrl-C: quit")
            if out.isatty() else Snapshots(out, args.rows or PLAIN_ROWS))
    session = Session(opts)

    def body(session, progress) -> int:
        progress.stop()                 # the table is the status
        table = FunctionTable()
        started = time.monotonic()

        def header() -> list:
            return format_header(session.target.description, table,
                                 session.capture.losses().lost, session.plan.backend,
                                 time.monotonic() - started, keys.sort)

        def draw() -> None:
            view.draw(header(), table, keys.sort)

        with view:
            view.waiting(draw)
            keys.redraw_with(draw)      # a sort key or a new size: at once
            try:
                for interval in session.interval_counts(REFRESH_S):
                    if keys.ended:
                        break
                    with keys.drawing:  # not while the keys' thread draws
                        table.refresh(interval.counts)
                        draw()
            finally:
                keys.redraw_with(None)  # the screen is about to go
        if not session.interrupt.requested:
            # ended on its own (the command exited, -d): the last table
            # stays on the terminal once its screen is gone
            view.leave(header(), table, keys.sort)
        return table.samples_all

    # keys are heard from the start: a run set up over the whole machine
    # takes seconds, and q ends it then too
    with Keys(sys.stdin if keys_read else None, session, args.sort,
              out.fileno() if out.isatty() else None) as keys:
        return run_session(opts, body, session=session)[0]


class Keys:
    """The keyboard of the terminal the table is drawn on, read a key at a
    time (no echo) in a thread of its own: q (or Q) ends the run (Ctrl-C
    stays a signal), SORT_KEYS change `sort`, and a change of `sort` or of
    the terminal's size (looked at as often as keys) calls `redraw` at
    once. The terminal's modes are restored on every way out."""

    def __init__(self, keys, session, sort: str, screen_fd: int | None = None):
        self.session = session
        self.fd = keys.fileno() if keys is not None else None
        self.screen_fd = screen_fd
        self.sort = sort
        self.ended = False
        self.redraw = None              # set while a table is on the screen
        self.drawing = threading.Lock()     # held by whoever draws or refreshes
        self._done = threading.Event()
        self._saved = self._reader = None

    def __enter__(self):
        if self.fd is not None:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd, termios.TCSANOW)
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        if self._reader is not None:
            self._reader.join()
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
        return False

    def redraw_with(self, draw) -> None:
        """What to call (holding `drawing`) when the sort or the size
        changes; None once the screen is no longer the table's."""
        with self.drawing:
            self.redraw = draw

    def _size(self):
        try:
            return os.get_terminal_size(self.screen_fd) if self.screen_fd is not None else None
        except OSError:
            return None

    def _read(self) -> None:
        size = self._size()
        while not self._done.is_set():
            ready = select.select([self.fd], [], [], KEY_POLL_S)[0]
            changed = False
            if ready:
                try:
                    data = os.read(self.fd, 64)
                except OSError:             # the terminal is gone: so is the view
                    data = b""
                if not data or b"q" in data.lower():
                    self.ended = True
                    self.session.stop()
                    return
                for key in data.decode("latin-1"):
                    if key in SORT_KEYS and SORT_KEYS[key] != self.sort:
                        self.sort, changed = SORT_KEYS[key], True
            now = self._size()
            if now != size:
                size, changed = now, True
            if changed:
                with self.drawing:
                    if self.redraw is not None:
                        self.redraw()


class Snapshots:
    """Not a terminal: the header and the `rows` hottest rows, printed
    once per refresh, a blank line after each."""

    def __init__(self, out, rows: int):
        self.out, self.rows = out, rows

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def waiting(self, draw) -> None:
        """Nothing to print before the first refresh."""

    def leave(self, header: list, table: FunctionTable, sort: str) -> None:
        """The last refresh was printed already."""

    def draw(self, header: list, table: FunctionTable, sort: str) -> None:
        lines = [*header, *format_rows(table, sort, self.rows, None)]
        self.out.write("\n".join(lines) + "\n\n")
        self.out.flush()


class Screen:
    """A terminal: the alternate screen without a cursor, redrawn in place
    as many rows as it has; the screen it replaced comes back at the end."""

    def __init__(self, out, rows: int | None, hint: str):
        self.out, self.rows, self.hint = out, rows, hint
        self.size = None                # of the last draw

    def __enter__(self):
        self.out.write("\x1b[?1049h\x1b[?25l")
        self.out.flush()
        return self

    def __exit__(self, *exc):
        self.out.write("\x1b[?25h\x1b[?1049l")
        self.out.flush()
        return False

    def waiting(self, draw) -> None:
        """The header and titles at once, before the first refresh."""
        draw()

    def leave(self, header: list, table: FunctionTable, sort: str) -> None:
        """The last table as plain lines on the terminal's own screen."""
        size = os.get_terminal_size(self.out.fileno())
        room = max(size.lines - 4, 1)
        lines = [*header, *format_rows(table, sort, min(room, self.rows or room), None)]
        self.out.write("".join(line[:size.columns] + "\n" for line in lines))
        self.out.flush()

    def draw(self, header: list, table: FunctionTable, sort: str) -> None:
        size = os.get_terminal_size(self.out.fileno())
        room = max(size.lines - 4, 1)            # header, titles, the hint's line
        titles, *rows = format_rows(table, sort, min(room, self.rows or room),
                                    size.columns)
        lines = [*(line[:size.columns] for line in header),
                 f"\x1b[7m{titles}\x1b[0m", *rows]
        # a new size: the whole screen cleared first, so no line a terminal
        # kept or moved while it resized stays beside the new table
        clear = "\x1b[2J" if size != self.size else ""
        self.size = size
        self.out.write(clear + "\x1b[H" + "".join(line + "\x1b[K\r\n" for line in lines)
                       + self.hint[:size.columns] + "\x1b[K\x1b[J")
        self.out.flush()
