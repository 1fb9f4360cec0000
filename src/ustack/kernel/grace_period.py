"""An RCU grace period waited for from user space: after it, no BPF
program that was running when it began still runs. A non-sleepable
program (perf_event, tracepoint, kprobe, raw tracepoint, non-sleepable
uprobe) runs inside rcu_read_lock, so what it read from a map entry
deleted before the wait is no longer in use after it: the in-kernel
unwinder's rows of an evicted object may then be overwritten
(capture/unwind_objects.py).

membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu() (kernel/sched/
membarrier.c), but the kernel skips it with one CPU online, and refuses it
under nohz_full: there, and where the call is missing, `available()` says
no and the caller keeps its rows where they are."""
from __future__ import annotations

import ctypes
import os

NR_MEMBARRIER = 324                  # x86-64
MEMBARRIER_CMD_QUERY = 0
MEMBARRIER_CMD_GLOBAL = 1

_libc = ctypes.CDLL(None, use_errno=True)
_available: bool | None = None


def _membarrier(cmd: int) -> int:
    ret = _libc.syscall(NR_MEMBARRIER, cmd, 0, 0)
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def _online_cpus() -> int:
    """CPUs online now, from sysfs ("0-1,3"); 1 when unreadable."""
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
    except OSError:
        return 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def available() -> bool:
    """Whether wait() is a real grace period here (asked once)."""
    global _available
    if _available is None:
        try:
            _available = bool(_membarrier(MEMBARRIER_CMD_QUERY) & MEMBARRIER_CMD_GLOBAL) \
                and _online_cpus() > 1
        except OSError:
            _available = False
    return _available


def wait() -> bool:
    """Wait for an RCU grace period (tens of ms); False where none could be
    waited for (the caller must not reuse what it unlinked)."""
    if not available() or _online_cpus() < 2:
        return False
    try:
        _membarrier(MEMBARRIER_CMD_GLOBAL)
    except OSError:
        return False
    return True
