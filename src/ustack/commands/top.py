"""`ustack top`: a profile shown live, the hottest functions refreshed
every second (perf top, py-spy top). The run is profile's (run_session,
Session.interval_counts); on a terminal the table fills the screen and q
or Ctrl-C ends it; otherwise a plain snapshot is printed per refresh."""
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
    view = (Screen(out, args.rows, "q or Ctrl-C: quit" if keys_read else "Ctrl-C: quit")
            if out.isatty() else Snapshots(out, args.rows or PLAIN_ROWS))
    session = Session(opts)

    def body(session, progress) -> int:
        progress.stop()                 # the table is the status
        table = FunctionTable()
        started = time.monotonic()

        def draw() -> None:
            view.draw(format_header(session.target.description, table,
                                    session.capture.losses().lost, session.plan.backend,
                                    time.monotonic() - started, args.sort),
                      table, args.sort)

        with view:
            view.waiting(draw)
            for interval in session.interval_counts(REFRESH_S):
                if keys.ended:
                    break
                table.refresh(interval.counts)
                draw()
        if not session.interrupt.requested:
            # ended on its own (the command exited, -d): the last table
            # stays on the terminal once its screen is gone
            view.leave(format_header(session.target.description, table,
                                     session.capture.losses().lost, session.plan.backend,
                                     time.monotonic() - started, args.sort), table, args.sort)
        return table.samples_all

    # keys are heard from the start: a run set up over the whole machine
    # takes seconds, and q ends it then too
    with Keys(sys.stdin if keys_read else None, session) as keys:
        return run_session(opts, body, session=session)[0]


class Keys:
    """The keyboard of the terminal the table is drawn on, read a key at a
    time (no echo) in a thread of its own: q (or Q) ends the run (Ctrl-C
    stays a signal). The terminal's modes are restored on every way out."""

    def __init__(self, keys, session):
        self.session = session
        self.fd = keys.fileno() if keys is not None else None
        self.ended = False
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

    def _read(self) -> None:
        while not self._done.is_set():
            if not select.select([self.fd], [], [], KEY_POLL_S)[0]:
                continue
            try:
                data = os.read(self.fd, 64)
            except OSError:                 # the terminal is gone: so is the view
                data = b""
            if not data or b"q" in data.lower():
                self.ended = True
                self.session.stop()
                return


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
        self.out.write("\x1b[H" + "".join(line + "\x1b[K\r\n" for line in lines)
                       + self.hint[:size.columns] + "\x1b[K\x1b[J")
        self.out.flush()
