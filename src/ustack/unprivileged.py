"""What a run without root may do: sample the user space of the user's own
processes (-p PID, -c CMD) with perf events, as perf_event_paranoid <= 2
allows any user; the stacks are copied and unwound by ustack, which reads
only what the user may read. What needs root (uprobes, tracepoints, BPF,
tracefs, another user's process, every process) is refused before anything
is made, in one line that names what is missing."""
from __future__ import annotations

import os

from .kernel import credentials
from .model import UstackError

ROOT = "root (CAP_SYS_ADMIN)"
INSTEAD = "without root, ustack profiles your own processes (profile -p PID or -c CMD)"

# events by kind, as the refusal names them
_EVENTS = {"uprobe": "uprobes", "uretprobe": "uretprobes", "usdt": "USDT probes",
           "syscall": "syscall events", "tracepoint": "tracepoints"}
# commands that count in the kernel with BPF, on what only root may probe
_KERNEL_COUNTED = {"offcpu": "scheduler tracepoints", "latency": "uprobes",
                   "memleak": "uprobes", "funccount": "uprobes"}


def check(opts, specs: list) -> None:
    """Refuse, in one line, the run of `opts` with the parsed events
    `specs` that a user without root cannot have; nothing for root."""
    if credentials.privileged():
        return
    why = _why_not(opts, specs)
    if why is not None:
        raise UstackError(why)


def check_dump(pid: int) -> None:
    """Refuse, in one line, a dump of `pid` (ptrace) that a user without
    root cannot have: another user's process, or one Yama keeps out."""
    if credentials.privileged():
        return
    why = _whose(pid, "dumping it needs", "dumps")
    scope = credentials.ptrace_scope()
    if why is None and scope is not None and scope > 0:
        why = (f"ptrace_scope is {scope}: only root may ptrace a process it did not "
               "start; set kernel.yama.ptrace_scope to 0 or run as root")
    if why is not None:
        raise UstackError(why)


def _whose(pid: int, needs: str, does: str) -> str | None:
    """Why `pid` is not this user's to sample or dump, or None (when it is,
    or is gone: the caller says so)."""
    owner = credentials.owner_uid(pid)
    if owner is None or owner == os.getuid():
        return None
    return (f"PID {pid} belongs to another user: {needs} {ROOT}; without root, "
            f"ustack {does} your own processes")


def _why_not(opts, specs: list) -> str | None:
    if opts.command in _KERNEL_COUNTED:
        return (f"{opts.command} needs {ROOT}: it counts in the kernel with BPF on "
                f"{_KERNEL_COUNTED[opts.command]}; {INSTEAD}")
    for spec in specs:
        if spec.kind in _EVENTS:
            return f"{_EVENTS[spec.kind]} need {ROOT}: {spec.text}; {INSTEAD}"
    if opts.backend in ("bpf", "tracefs"):
        return (f"--backend {opts.backend} needs {ROOT}; {INSTEAD}, "
                "on the perf backend (--backend auto or perf)")
    if opts.kernel_stacks:
        return f"--kernel needs {ROOT}: kernel stacks are root's to see; {INSTEAD}"
    for pid in (opts.pid, opts.container_pid):
        why = None if pid is None else _whose(pid, "sampling it needs", "profiles")
        if why is not None:
            return why
    if opts.pids:
        return (f"-p with several PIDs traces every process and keeps theirs, which "
                f"needs {ROOT}; {INSTEAD}, one PID at a time")
    if opts.pid is None and opts.cmdline is None:
        return f"tracing every process needs {ROOT}; {INSTEAD}"
    paranoid = credentials.perf_event_paranoid()
    if paranoid is not None and paranoid > credentials.USER_SAMPLING_MAX:
        most = credentials.USER_SAMPLING_MAX
        return (f"perf_event_paranoid is {paranoid}: only root may sample processes "
                f"here; set it to {most} or run as root "
                f"(sysctl kernel.perf_event_paranoid={most})")
    return None

