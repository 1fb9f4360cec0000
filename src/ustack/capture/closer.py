"""Closing a big capture without making the user wait for it. The kernel
waits an RCU grace period (~75-116 ms here) for each trace event whose last
perf event is closed, one at a time under one lock: a run of 2,000 uprobes
took minutes to end, and even a one-probe run waited ~0.13 s after its
last line (its event, the exec watch, the BPF programs' detaching). A
child process of its own session (Ctrl-C of the terminal does not reach
it; unwaited: init reaps it once the run has exited, the run's prompt
having come back) holds the capture's descriptors, the run drops its own
copies at once (not the last: no wait) and goes on, and the child closes
them for real and removes what the run defined (one fork: a middle
process the run waited for cost a fork and an exit, ~1 ms of a one-hit
trace's CPU).
The run's guardian (kernel/guardian.py) watches the closer: it holds the
guardian's pipe, says DONE at the end, and if it is killed mid-work the
guardian removes the rest as the kernel lets go of it."""
from __future__ import annotations

import os
import signal

# below this many probes a capture that defined probes in tracefs closes in
# the foreground (~0.1 s each), so the prompt comes back with tracefs clean;
# one that defined none (perf events of existing tracepoints, the uprobe
# PMU, BPF) always closes in the background: nothing of it is seen after
BACKGROUND_PROBES = 4


def close_in_background(close, release, finished=None, unmap=None) -> bool:
    """Call release() in this process (fast: its descriptors are not the
    last, and it leaves the probe definitions alone), then close() in a
    detached child that holds copies of them, and `finished()` there
    after it (the run's guardian hears that the closer is done: one that
    is killed mid-work leaves the guardian the rest to remove). False if
    no process could be forked: close() ran here. `unmap()` first drops
    the run's ring mappings: each fork copies the page table entries of
    such mappings, and the middle child's exit drops them again (~2 ms of
    a one-hit trace's CPU for its 32 MiB ring)."""
    if unmap is not None:
        unmap()
    go_read, go_write = os.pipe()
    try:
        pid = os.fork()
    except OSError:                 # no process to spare: close here, slowly
        pid = None
    if pid == 0:
        try:
            os.close(go_write)
            _finish(close, go_read, finished)
        finally:
            os._exit(0)
    os.close(go_read)
    forked = pid is not None
    try:
        if forked:
            release()               # drops this process's copies
        else:
            close()
    finally:
        os.close(go_write)          # the closer may begin
    return forked


def close_capture(capture, background: bool, probes: int, finished=None) -> bool:
    """Close a run's capture: in a detached closer when `background` (the
    CLI's choice: the prompt comes back at once) and the capture can
    release its descriptors and either has many `probes` (the kernel waits
    ~0.1 s for each) or defined none in tracefs (nothing a user checks
    right after the run is left meanwhile), else here. True when a closer
    took it (the run's guardian is to watch the closer then)."""
    if background and capture.release is not None and (
            probes >= BACKGROUND_PROBES or not capture.defines_probes()):
        return close_in_background(capture.close, capture.release, finished,
                                   getattr(capture, "unmap", None))
    capture.close()
    return False


NAME = "ustack-closer"           # its comm, for ps (and the tests' leak check)


def _finish(close, go_read: int, finished) -> None:
    os.setsid()
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(NAME)
    except OSError:
        pass
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # not the run's handler
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):             # hold no pipe of the caller's open
        os.dup2(null, fd)
    os.read(go_read, 1)              # EOF: the run dropped its copies
    close()
    if finished is not None:
        finished()
