"""Every probe a run's parsed EVENTs stand for: the one dispatch by event
kind over the resolvers (uprobe, usdt, tracepoint and syscall, profile),
kept apart from them so that they need not import one another. A
resolver is imported when an EVENT needs it: a syscall run does without
the uprobe resolver's ELF and disassembly modules."""
from __future__ import annotations

from ustack.interrupt import NEVER
from ustack.model import ProfileProbe, UstackError
from ustack.probes.tracepoints import tracepoint_probes


def resolve_probes(specs: list, pid: int | None = None,
                   notes: list | None = None, unsafe: bool = False,
                   interrupt=NEVER) -> list:
    """Every probe the parsed EVENTs stand for (a glob may give many);
    `unsafe`: --unsafe-address (see resolve_uprobes); `interrupt`: the
    run's (interrupt.py), heard between two probes."""
    probes = []
    for spec in specs:
        interrupt.check()
        if spec.kind in ("uprobe", "uretprobe"):
            from ustack.probes.resolve import resolve_uprobes
            probes.extend(resolve_uprobes(spec, pid, notes, unsafe, interrupt))
        elif spec.kind == "usdt":
            from ustack.probes.usdt import resolve_usdt
            probes.extend(resolve_usdt(spec, pid, notes))
        elif spec.kind in ("syscall", "tracepoint"):
            probes.extend(tracepoint_probes(spec))
        elif spec.kind == "profile":
            probes.append(ProfileProbe(spec, spec.hz, f"profile:hz:{spec.hz}"))
        else:
            raise UstackError(f"unsupported event kind: {spec.kind}")
    return probes
