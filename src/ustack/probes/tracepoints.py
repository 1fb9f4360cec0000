"""Tracepoint and syscall EVENTs to probes: kept apart from the uprobe
resolver, whose imports (ELF, disassembly, debug files: ~15 ms) a run of
syscalls and tracepoints does not need."""
from __future__ import annotations

import fnmatch
import os

from ustack.kernel.tracefs import events_dir, tracepoint_groups, tracepoint_names
from ustack.model import ProbeSpec, TracepointProbe, UstackError

_GLOB_CHARS = "*?["


def is_glob(text: str) -> bool:
    return any(c in text for c in _GLOB_CHARS)


def tracepoint_probes(spec: ProbeSpec) -> list:
    if spec.kind not in ("syscall", "tracepoint"):
        raise ValueError(f"not a tracepoint spec: {spec.kind}")
    if spec.kind == "syscall":
        if not is_glob(spec.name) and _is_tracepoint("syscalls", "sys_enter_" + spec.name):
            return [TracepointProbe(spec, "syscalls", "sys_enter_" + spec.name,
                                    f"syscall:{spec.name}")]
        entries = tracepoint_names("syscalls")
        if not entries:
            raise UstackError("this kernel has no syscall tracepoints "
                              f"({events_dir()}/syscalls is missing)")
        names = [e[len("sys_enter_"):] for e in entries if e.startswith("sys_enter_")]
        found = pick(names, spec.name, "syscall")
        return [TracepointProbe(spec, "syscalls", "sys_enter_" + n, f"syscall:{n}")
                for n in found]
    if not is_glob(spec.group + spec.name) and _is_tracepoint(spec.group, spec.name):
        return [TracepointProbe(spec, spec.group, spec.name,
                                label=f"tracepoint:{spec.group}:{spec.name}")]
    pairs = [f"{g}:{n}" for g in tracepoint_groups() for n in tracepoint_names(g)]
    found = pick(pairs, f"{spec.group}:{spec.name}", "tracepoint")
    return [TracepointProbe(spec, *p.split(":"), label=f"tracepoint:{p}")
            for p in found]


def _is_tracepoint(group: str, name: str) -> bool:
    """One named tracepoint exists: a stat, where listing the ~700 syscall
    tracepoints to match a name cost ~4 ms of start-up."""
    return "/" not in group + name and os.path.isfile(
        os.path.join(events_dir(), group, name, "id"))


def pick(names: list, pattern: str, what: str) -> list:
    found = sorted(fnmatch.filter(names, pattern))
    if found:
        return found
    msg = f"no {what} matches '{pattern}'"
    if not is_glob(pattern):
        import difflib
        near = difflib.get_close_matches(pattern, names, n=5)
        if near:
            msg += f"; did you mean: {', '.join(near)}?"
    raise UstackError(msg)
