"""Names of PHP functions, as the kernel copied them at the sample
(bpf/php.h, capture/bpf_php.py): a PHP frame's word holds the id the
kernel gave its function in that process and the line of its opline
(model.php_frame_parts). A function is `Class::method`, `function`, or
`{main}` for a script's body, as PHP's own stack traces name them; a
builtin (an internal function) has no file. An id whose names never
arrived is shown as `[php function]`, never with another's name."""
from __future__ import annotations

import os
import struct
import threading

from ..model import Frame, printable

MAX_FUNCTIONS = 1 << 18         # (pid, id) names kept
UNNAMED = "[php function]"
MAIN = "{main}"                 # a script's body (PHP's traces name it so)
NAME_COPY, FILE_COPY = 64, 96   # php.h's PHP_NAME_COPY, PHP_FILE_COPY
# struct php_name: first line, the name's, class's and file's lengths, type
_HEAD = struct.Struct("<IHHHBx")
_USER_FUNCTION = 2              # ZEND_USER_FUNCTION


class PhpFunctions:
    """The PHP functions the kernel named, per (pid, id)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._names: dict = {}          # (pid, id) -> (function, file)
        self.unnamed = 0                # frames shown as UNNAMED
        # set by a capture whose kernel pass writes PHP words (bpf/php.h): in
        # any other stack a word with their tag is a garbage return address
        self.active = False
        # takes the names the kernel copied since last asked (the run's
        # bpf_php.PhpObjects.harvest): an id met before its names were
        # taken (copied in the run's last 0.1 s) asks once more
        self.refresh = None

    def remember(self, pid: int, function_id: int, value: bytes) -> None:
        """PHP_NAMES' value (struct php_name) of `function_id` in pid."""
        line_start, name_len, scope_len, file_len, kind = _HEAD.unpack_from(value)
        at = _HEAD.size
        name = _text(value[at:at + NAME_COPY], name_len)
        scope = _text(value[at + NAME_COPY:at + 2 * NAME_COPY], scope_len)
        path = _text(value[at + 2 * NAME_COPY:at + 2 * NAME_COPY + FILE_COPY], file_len, tail=True)
        self.remember_read(pid, function_id, kind, name, scope, path)

    def remember_read(self, pid: int, function_id: int, kind: int, name: str, scope: str,
                      path: str) -> None:
        """The names of `function_id` in pid as read from the process
        (unwind/php_live.py) or copied by the kernel: its type
        (ZEND_USER_FUNCTION or not), name, class and file ("" where none)."""
        if not name:
            name = MAIN if kind == _USER_FUNCTION else UNNAMED
        if scope:
            name = f"{scope}::{name}"
        with self._lock:
            if len(self._names) >= MAX_FUNCTIONS:
                self._names.clear()
            self._names[(pid, function_id)] = (printable(name), printable(path))

    def recorded(self, pid: int, parts: tuple, function: str, file: str, line: int) -> None:
        """A frame's names as a recording kept them (its line is its word's)."""
        self.remember_read(pid, parts[0], _USER_FUNCTION, function, "", file)

    def frame(self, pid: int, function_id: int, line: int) -> Frame:
        found = self._names.get((pid, function_id))
        if found is None and self.refresh is not None:
            self.refresh()
            found = self._names.get((pid, function_id))
        if found is None:
            self.unnamed += 1
            return Frame(addr=0, module="", function=UNNAMED, kind="php")
        name, path = found
        return Frame(addr=0, module=os.path.basename(path), function=name,
                     file=path, line=line if path else 0, kind="php")


def _text(raw: bytes, length: int, tail: bool = False) -> str:
    """The characters the kernel copied of a string `length` long: all of
    it, or its first (its last, `tail`) len(raw), marked `...` where cut."""
    if length == 0:
        return ""
    text = raw[:min(length, len(raw))].decode("utf-8", "replace")
    if length > len(raw):
        return "..." + text if tail else text + "..."
    return text
