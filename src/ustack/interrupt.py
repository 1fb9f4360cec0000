"""A request to end a run (Ctrl-C, SIGTERM, Session.stop) that its set-up
hears too: the loops that open events, one at a time, check it between two
and give up at once, so a run asked to end while it is opening thousands of
probes ends then, not after all of them are open (and its command never
starts). Set from a signal handler or another thread: a plain flag."""
from __future__ import annotations

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
