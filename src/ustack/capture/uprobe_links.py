"""Many uprobes behind one program: uprobe_multi links, one per binary
(and kind: entries, returns), the probe that fired named by the link's
cookie (its index in the run's probes).

Why: a perf event per uprobe costs a tracefs definition and a perf event
per CPU to set up, and closing each waits for RCU grace periods (~0.1 s,
serialized by the kernel's event_mutex): a glob of ~2,000 libc functions
took minutes to start and to end. A link puts all its uprobes in at once
and takes them away after one wait, and one program is verified instead of
one per probe.

Scope: -p/-c link to the traced process (the kernel puts the breakpoints
in its memory only, its threads run the program), a system-wide run to
every process (-p A,B: a link each). A link does not follow the children
a process forks, as the perf events' inheritance does: linking for every
process and keeping to the traced set in the program would follow them,
but puts the breakpoints into every process mapping the binary, ustack's
own included (a count of ~3,600 libc functions of a -c command took 21.6 s
so, 4.7 s linked to the command). Below LINKED_FROM uprobes a run keeps
perf events, and with them the children.
"""
from __future__ import annotations

from collections import defaultdict

from ..kernel import bpf_syscall
from ..model import UprobeProbe, UstackError

# uprobes from which a run links them (each perf event costs ~0.1 s to end)
LINKED_FROM = 8
# uprobes per link: Ctrl-C is looked at between links
PER_LINK = 256


def linkable(probe) -> bool:
    """Whether `probe` can go behind a link: a uprobe or uretprobe without
    fetch-args (those are per probe: capture/bpf_fetchargs.py) or a USDT
    semaphore."""
    return (isinstance(probe, UprobeProbe) and not probe.fetch_args
            and not probe.ref_ctr_offset)


def linked(probes: list) -> frozenset:
    """The indices of the probes a run puts behind links: every linkable
    uprobe, when there are at least LINKED_FROM of them and this kernel
    makes links (Linux 6.6+); else none."""
    found = [i for i, p in enumerate(probes) if linkable(p)]
    if len(found) < LINKED_FROM or not bpf_syscall.kernel_at_least(6, 6):
        return frozenset()
    return frozenset(found)


def attach(sites: list, probes: list, owned, interrupt, pid: int = 0) -> None:
    """Links running, for each (probe index, program, cookie) of `sites`,
    the program at that probe with that cookie, in process `pid` (0: every
    process), in the order of `sites`; `owned` keeps and closes them."""
    groups: dict = defaultdict(list)    # (program, path, returns) -> [(offset, cookie)]
    for index, prog, cookie in sites:
        p = probes[index]
        groups[(prog, p.path, p.spec.kind == "uretprobe")].append((p.file_offset, cookie))
    for (prog, path, returns), where in groups.items():
        for at in range(0, len(where), PER_LINK):
            interrupt.check()
            part = where[at:at + PER_LINK]
            try:
                owned.link(bpf_syscall.attach_uprobe_multi(
                    prog, path, [o for o, _c in part], [c for _o, c in part],
                    pid, returns))
            except OSError as e:
                raise UstackError(f"cannot put {len(part)} uprobe(s) on {path}: "
                                  f"{e.strerror}")


def pids_of(target) -> tuple:
    """The processes a run's links are for: the traced one (-p, -c), each
    of -p A,B, or every process (0)."""
    return (target.pid,) if target.scope != "system" else target.pids or (0,)
