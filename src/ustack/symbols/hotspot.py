"""Names of the Java methods of HotSpot JVMs' stacks: a Java frame is
(Method*, bci) (model.java_frame_parts), put there by the user-space walk
of a JVM's copied stacks (unwind/hotspot_live.py), which reads and checks
each method's name while its process lives and tells it here, or by a
recording, which keeps each frame's names as they were read then
(recording/format.py's I records). A frame whose method was not named
then is shown as `[java 0x...]`, never with another method's name."""
from __future__ import annotations

import bisect
import threading
from collections import OrderedDict

from ..model import JAVA_NO_BCI, Frame
from .recorded_names import RecordedNames

MAX_METHODS = 1 << 16           # (pid, Method*) names kept


class JavaMethods:
    """The Java methods named so far, per process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._names: OrderedDict = OrderedDict()     # (pid, Method*) -> name
        self._named_pids: set = set()
        # (pid, Method*, bci) -> names: a recording's frames
        self._recorded = RecordedNames(MAX_METHODS * 16)
        self.unnamed = 0            # frames shown as [java 0x...]
        # set when the run walks JVMs' stacks (a word with the Java tag
        # comes from that walk only)
        self.active = False

    @property
    def warnings(self) -> list:
        if not self.unnamed:
            return []
        return [f"{self.unnamed} Java frames are shown as [java 0x...]: their method "
                "could not be read when their stack was walked"]

    def remember(self, pid: int, method: int, name: str, file: str = "",
                 lines: tuple = ()) -> None:
        """Method* `method` of pid is `name`, in source `file`, its
        ((bci, line), ...) table `lines`: read while pid lives."""
        with self._lock:
            if len(self._names) >= MAX_METHODS:
                self._names.popitem(last=False)
            self._names[(pid, method)] = (name, file, lines)
            self._named_pids.add(pid)

    def named_in(self, pid: int) -> bool:
        """Whether a Java frame of pid was named from its JVM."""
        return pid in self._named_pids

    def recorded(self, pid: int, parts: tuple, function: str, file: str, line: int) -> None:
        """A frame's names as a recording kept them (per bci: its line);
        `parts`: model.java_frame_parts of its word."""
        method, bci, _inlined = parts
        self._recorded.add((pid, method, bci), function, file, line)
        with self._lock:
            self._named_pids.add(pid)

    def frame(self, pid: int, method: int, bci: int, inlined: bool = False) -> Frame:
        found = self._recorded.get((pid, method, bci))
        if found is not None:
            name, file, line = found
            return Frame(addr=0, module=file, function=name, file=file if line else "",
                         line=line, kind="java", inlined=inlined)
        with self._lock:
            found = self._names.get((pid, method))
        if found is None:
            self.unnamed += 1
            return Frame(addr=0, module="", function=f"[java {method:#x}]", kind="java",
                         inlined=inlined)
        name, file, lines = found
        line = 0
        if bci != JAVA_NO_BCI and lines:
            # the entry of the last bci at or before this one (javac's
            # tables are in bci order)
            at = bisect.bisect_right(lines, (bci, 1 << 30)) - 1
            line = lines[at][1] if at >= 0 else 0
        return Frame(addr=0, module=file, function=name, file=file if line else "",
                     line=line, kind="java", inlined=inlined)
