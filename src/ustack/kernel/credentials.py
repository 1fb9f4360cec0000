"""Who the running user is to the kernel: root's rights (CAP_SYS_ADMIN) or
not; how far perf_event_paranoid lets a user sample their own processes;
whose a process is; how much perf buffer a user may lock."""
from __future__ import annotations

import os
import resource

CAP_SYS_ADMIN = 21
PARANOID = "/proc/sys/kernel/perf_event_paranoid"
PTRACE_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
MLOCK_KB = "/proc/sys/kernel/perf_event_mlock_kb"
# The highest perf_event_paranoid at which a user may sample the user space
# of their own processes (perf_event_open(2); Debian's 3 forbids it).
USER_SAMPLING_MAX = 2
PAGE = os.sysconf("SC_PAGE_SIZE")

_privileged: list = []              # the answer, once: credentials do not change


def privileged() -> bool:
    """Whether this process has root's rights over tracing: CAP_SYS_ADMIN
    in its effective set (root has it unless a container dropped it)."""
    if not _privileged:
        _privileged.append(os.geteuid() == 0 or bool(_effective_caps() >> CAP_SYS_ADMIN & 1))
    return _privileged[0]


def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def perf_event_paranoid() -> int | None:
    """kernel.perf_event_paranoid, or None when it cannot be read."""
    return _read_int(PARANOID)


def ptrace_scope() -> int | None:
    """kernel.yama.ptrace_scope, or None without Yama (then a user may
    ptrace any process of their own)."""
    return _read_int(PTRACE_SCOPE)


def owner_uid(pid: int) -> int | None:
    """The user a process runs as (its real uid: whose it is), or None
    when it is gone. One whose real, effective or saved uid differs from
    ours is not ours to sample (ptrace's rule, which perf_event_open keeps)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uids = {int(u) for u in line.split()[1:4]}
                    me = os.getuid()
                    return me if uids == {me} else min(uids - {me})
    except (OSError, ValueError):
        pass
    return None


def lockable_buffer_pages(cpus: int) -> int:
    """The pages of perf ring buffers a user without CAP_IPC_LOCK may map
    over `cpus` CPUs together: perf_event_mlock_kb per CPU, then what
    RLIMIT_MEMLOCK allows (the kernel's rule in perf_mmap)."""
    per_cpu = (_read_int(MLOCK_KB) or 516) * 1024 // PAGE
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    rlimit = (1 << 40) if soft == resource.RLIM_INFINITY else soft // PAGE
    return per_cpu * cpus + rlimit
