"""The user stack lines of ftrace's text output (the `trace` file with the
`userstacktrace` option), as the kernel prints them (trace_output.c):

    comm-PID [cpu] flags time: <user stack trace>
     =>  <00005593e0f6a276>                 nosym-userobj: the address
     => /usr/bin/prog[+0x276]               sym-userobj: the file and the
                                            offset from the start of its
                                            mapping (vm_start), not of the file
     => /usr/bin/prog[+0x276] <0000…276>    sym-userobj and sym-addr

Kernel stacks (`<stack trace>`) use the same ` => ` lines with kernel
symbols; they are not user frames."""
from __future__ import annotations

import re
from ..values import value

USER_HEADER = "<user stack trace>"
KERNEL_HEADER = "<stack trace>"
_USER_LIMIT = 1 << 47          # x86-64 user addresses lie below this

_ADDRESS = re.compile(r"\s*=>\s+<([0-9a-fA-F]+)>\s*")
_OBJECT = re.compile(r"\s*=>\s+(\S.*?)\[\+0x([0-9a-fA-F]+)\](?:\s+<([0-9a-fA-F]+)>)?\s*")


@value
class UserFrame:
    """One user frame line: an absolute address, or a file and the offset
    from the start of the mapping it was in (then maybe the address too)."""
    index: int                     # 0: where the thread was; then return addresses
    addr: int | None = None
    path: str | None = None
    offset: int = 0


class UserStackLines:
    """Tells user frame lines from the rest, line by line: a ` => ` line is
    a user frame after a `<user stack trace>` header, or, in an excerpt
    without headers, when it holds a user-space address."""

    def __init__(self):
        self.state = None            # "user" | "kernel" | None
        self.index = 0

    def frame(self, line: str) -> UserFrame | None:
        if "=>" not in line[:8]:
            self.state = ("user" if USER_HEADER in line
                          else "kernel" if KERNEL_HEADER in line else None)
            self.index = 0
            return None
        if self.state == "kernel":
            return None
        frame = _parse(line, self.index)
        if frame is not None:
            self.index += 1
        return frame


def _parse(line: str, index: int) -> UserFrame | None:
    m = _ADDRESS.fullmatch(line)
    if m:
        addr = int(m.group(1), 16)
        return UserFrame(index, addr=addr) if addr < _USER_LIMIT else None
    m = _OBJECT.fullmatch(line)
    if m:
        path = m.group(1)
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        addr = int(m.group(3), 16) if m.group(3) else None
        return UserFrame(index, addr=addr, path=path, offset=int(m.group(2), 16))
    return None
