"""Names chosen to break a tool's output: a thread name (comm) and a
function whose name and file hold a NUL, a terminal escape, a newline and
a `;` (what would end a folded line or forge a frame). The function calls
os.getppid() COUNT times (argv[1]), so the test knows every event."""
import ctypes
import os
import sys

EVIL = "evil\x00\x1b[2J\nfake;frame"

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, b"bad\x1bcomm", 0, 0, 0)          # PR_SET_NAME


def calls(n):
    for _ in range(n):
        os.getppid()


code = calls.__code__
renamed = code.replace(co_name=EVIL, co_filename=EVIL + ".py",
                       **({"co_qualname": EVIL} if sys.version_info >= (3, 11) else {}))
hostile = type(calls)(renamed, globals())
hostile(int(sys.argv[1]))
