"""Reading /proc: a process's threads, executable mappings and comm."""
from __future__ import annotations

import os

from ..model import Mapping


def process_exists(pid: int) -> bool:
    """True while the process runs; a zombie (exited, not yet reaped by its
    parent) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    # the state follows the parenthesised comm, which may itself hold ')'
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] not in ("Z", "X")


def threads(pid: int) -> list:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def comm(pid: int, tid: int = 0) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    try:
        with open(path) as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def host_path(pid: int, path: str) -> str:
    """Where this tool can open a file the process sees at `path` (the
    process may be in another mount namespace, e.g. a container)."""
    if not path.startswith("/"):
        return ""
    via_root = f"/proc/{pid}/root{path}"
    try:
        if os.stat(via_root).st_ino != os.stat(path).st_ino:
            return via_root
    except OSError:
        return via_root if os.path.exists(via_root) else ""
    return ""


def executable_mappings(pid: int) -> list:
    """The executable mappings of /proc/PID/maps ([] if it is gone)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            lines = f.readlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 5 or "x" not in parts[1]:
            continue
        lo, hi = parts[0].split("-")
        path = parts[5].strip() if len(parts) == 6 else ""
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), path,
                           host_path(pid, path)))
    return out
