"""A request to end a run (Ctrl-C, SIGTERM, Session.stop) that its set-up
hears too: the loops that open events, one at a time, check it between two
and give up at once, so a run asked to end while it is opening thousands of
probes ends then, not after all of them are open (and its command never
starts). Set from a signal handler or another thread: a plain flag."""
from __future__ import annotations

import threading
from contextlib import contextmanager

from .model import UstackError


class Interrupted(UstackError):
    """Set-up gave up because the run was asked to end."""

    def __init__(self):
        super().__init__("interrupted while setting up: nothing was traced")


class Interrupt:
    def __init__(self):
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def check(self) -> None:
        """Raise Interrupted if the run was asked to end."""
        if self.requested:
            raise Interrupted()


NEVER = Interrupt()          # for what runs without one: never requested

_current = threading.local()


@contextmanager
def heard(interrupt: Interrupt):
    """While set-up runs in this thread, waits deep below it that are not
    handed the run's Interrupt (a builder child's, objfile/builders.py:
    seconds for a big object's first run) hear it through current()."""
    before = getattr(_current, "interrupt", NEVER)
    _current.interrupt = interrupt
    try:
        yield interrupt
    finally:
        _current.interrupt = before


def current() -> Interrupt:
    """The Interrupt of the set-up running in this thread, else NEVER."""
    return getattr(_current, "interrupt", NEVER)
