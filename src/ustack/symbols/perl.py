"""Names of Perl subs, as the kernel copied them at the sample (bpf/perl.h):
a Perl frame in a stack is (its CV's address, line) (model.perl_frame_parts),
and the sub's name, package and file came through PERL_SUBS
(capture/bpf_perl.py), so naming reads nothing of the process, which may be
gone. The main program's body has no name (the kernel copies none): it is
shown as MAIN. A frame whose sub was never copied (the map was full) is
shown as `[perl 0x...]`, never with another sub's name."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict

from ..model import Frame, printable

MAX_SUBS = 1 << 16              # (pid, cv) -> names kept
MAIN = "<main>"                 # the main program's body, as Python's <module>


class PerlSubs:
    """The Perl subs the kernel named, per process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._subs: OrderedDict = OrderedDict()    # (pid, cv) -> (function, file)
        self.unnamed = 0            # frames shown as [perl 0x...]
        # set by a capture whose kernel pass writes Perl words (bpf/perl.h):
        # in any other stack a word with their tag is no Perl frame
        self.active = False
        # set by that capture too: takes the subs the kernel copied since
        # last asked (a recording names its frames as they come)
        self.refresh = None

    @property
    def warnings(self) -> list:
        if not self.unnamed:
            return []
        return [f"{self.unnamed} Perl frames are shown as [perl 0x...]: the kernel's "
                "table of Perl subs was full when they were sampled"]

    def remember(self, pid: int, cv: int, name: str, package: str, file: str) -> None:
        """What the kernel copied of sub `cv` in pid (empty names: the main
        program's body)."""
        function = f"{package}::{name}" if package and name else name or MAIN
        with self._lock:
            if len(self._subs) >= MAX_SUBS:
                self._subs.popitem(last=False)
            self._subs[(pid, cv)] = (printable(function), printable(file))

    def recorded(self, pid: int, parts: tuple, function: str, file: str, line: int) -> None:
        """A frame's names as a recording kept them (its line is its word's)."""
        self.remember(pid, parts[0], function, "", file)

    def frame(self, pid: int, cv: int, line: int) -> Frame:
        with self._lock:
            found = self._subs.get((pid, cv))
        if found is None:
            self.unnamed += 1
            return Frame(addr=0, module="", function=f"[perl {cv:#x}]", kind="perl")
        function, file = found
        return Frame(addr=0, module=os.path.basename(file), function=function, file=file,
                     line=line, kind="perl")
