"""Reading /proc: a process's threads, executable mappings and comm, and
our own vDSO image."""
from __future__ import annotations

import os
import re
import struct

from ..model import Mapping
from .proc_root import mapped_file


def process_exists(pid: int) -> bool:
    """True while the process runs; a zombie (exited, not yet reaped by its
    parent) counts as gone."""
    return process_state(pid) not in (None, "Z", "X")


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, Z...), None if no such
    process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return _state(f.read())
    except OSError:
        return None


def _state(stat: str) -> str | None:
    """The state letter of a stat file's text: it follows the parenthesised
    comm, which may itself hold ')'."""
    return stat[stat.rfind(")") + 2:stat.rfind(")") + 3] or None


def root_denied(pid: int) -> str | None:
    """Why this process's files (/proc/PID/root) cannot be read, or None:
    another user namespace's, or one ptrace rules keep out."""
    try:
        os.stat(f"/proc/{pid}/root/")
    except (PermissionError, OSError) as e:
        if isinstance(e, PermissionError) or e.errno == 1:
            return f"/proc/{pid}/root: {e.strerror.lower()}"
    return None


PF_KTHREAD = 0x00200000            # include/linux/sched.h


def is_kernel_thread(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    flags = stat[stat.rfind(")") + 2:].split()[6]     # field 9 of stat(5)
    return bool(int(flags) & PF_KTHREAD)


def is_running(pid: int) -> bool:
    """Whether a thread of the process is on a CPU or waiting for one
    (state R) now."""
    for tid in threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                if _state(f.read()) == "R":
                    return True
        except OSError:
            continue
    return False


def started(pid: int) -> float | None:
    """When the process started, in seconds since the epoch, to about a
    second (the kernel keeps its boot time in whole seconds); None if it
    is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        ticks = int(stat[stat.rfind(")") + 2:].split()[19])    # field 22 of stat(5)
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> list:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def thread_batches(pid: int):
    """Yield sets of pid's thread ids not yielded before, until a rescan
    finds none new: a thread cloned by a thread not yet covered by the
    caller shows up only on the next scan."""
    seen: set = set()
    while True:
        new = set(threads(pid)) - seen
        if not new:
            return
        yield new
        seen |= new


def tgid(tid: int) -> int:
    """The process a thread belongs to (its own id if it is gone)."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


def comm(pid: int, tid: int = 0) -> str:
    path = f"/proc/{pid}/task/{tid}/comm" if tid else f"/proc/{pid}/comm"
    try:
        with open(path) as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def host_path(pid: int, path: str, start: int | None = None,
              end: int | None = None) -> str:
    """Where this tool can open a file the process sees at `path` (mapped
    at start-end, when known): "" when `path` itself is that file here;
    the process may be in another mount namespace, e.g. a container (see
    proc_root.mapped_file)."""
    return mapped_file(pid, path, start, end)


_MAPS_LINE = re.compile(r"([0-9a-f]+)-([0-9a-f]+) ([r-][w-][x-][sp]) ([0-9a-f]+) "
                        r"[0-9a-f]+:[0-9a-f]+ \d+ *(.*)")


def pids() -> list:
    """Every process now running (kernel threads included)."""
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def executable_mappings(pid: int) -> list:
    """The executable mappings of /proc/PID/maps ([] if it is gone)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            text = f.read()
    except OSError:
        return []
    return [Mapping(m.start, m.end, m.pgoff, m.path,
                    host_path(pid, m.path, m.start, m.end))
            for m in parse_maps(text, strict=False)]


def maps_error(pid: int) -> str | None:
    """Why /proc/PID/maps cannot be read (its strerror), or None: a process
    can exist and still hide its maps (another user's, or one in a user
    namespace above the reader's)."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            f.read(1)
    except OSError as e:
        return e.strerror
    return None


def parse_maps(text: str, strict: bool = True) -> list:
    """The executable mappings in the text of a /proc/PID/maps file (a live
    one, or a copy saved for later). strict: ValueError naming the first
    line that is not a maps line; else such lines are skipped."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _MAPS_LINE.fullmatch(line.rstrip())
        if m is None:
            if strict and line.strip():
                raise ValueError(f"line {n} is not a /proc/PID/maps line: {line[:60]!r}")
            continue
        if "x" not in m.group(3):
            continue
        path = m.group(5)
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        out.append(Mapping(int(m.group(1), 16), int(m.group(2), 16), int(m.group(4), 16), path))
    return out


def anonymous_writable(pid: int) -> list:
    """(start, end) of each private writable mapping of no file (heap
    arenas, thread stacks) of /proc/PID/maps ([] if it is gone)."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 5 and fields[1].startswith("rw") and fields[1][3] == "p":
                    start, end = fields[0].split("-")
                    out.append((int(start, 16), int(end, 16)))
    except (OSError, ValueError):
        return out
    return out


def own_vdso() -> tuple | None:
    """(mapping, image bytes) of this process's own [vdso], read from
    /proc/self/mem (no ptrace rights needed), or None when there is none
    or it cannot be read."""
    try:
        with open("/proc/self/maps") as f:
            # the one line parsed, not the ~100 of ustack's own maps
            lines = [line for line in f.read().splitlines() if line.endswith(" [vdso]")]
        maps = parse_maps("\n".join(lines), strict=False)
        own = next((m for m in maps if m.path == "[vdso]"), None)
        if own is None:
            return None
        with open("/proc/self/mem", "rb") as f:
            return own, os.pread(f.fileno(), own.end - own.start, own.start)
    except (OSError, ValueError, OverflowError):
        return None


def let_go(kept: dict) -> None:
    """Close the /proc/PID/mem of each process in `kept` (pid -> an object
    with `.mem`, a ProcessMemory, or None) and forget them all: a names
    table's bound reached, or its run over."""
    for proc in kept.values():
        if proc is not None:
            proc.mem.close()
    kept.clear()


class ProcessMemory:
    """Reads of a process's memory through /proc/PID/mem (root; no ptrace
    stop needed): an interpreter's state, its code objects."""

    def __init__(self, pid: int):
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)

    def read(self, addr: int, size: int) -> bytes:
        """`size` bytes at `addr`; OSError where they cannot be read (also
        an address beyond the user range: a pointer read mid-change)."""
        try:
            data = os.pread(self.fd, size, addr)
        except OverflowError:
            raise OSError(f"no address {addr:#x}") from None
        if len(data) != size:
            raise OSError(f"short read at {addr:#x}")
        return data

    def word(self, addr: int) -> int:
        return struct.unpack("<Q", self.read(addr, 8))[0]

    def close(self) -> None:
        os.close(self.fd)
