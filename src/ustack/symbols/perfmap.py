"""Names for JIT-compiled code from /tmp/perf-PID.map, the file JITs (V8,
the JVM through `jcmd PID Compiler.perfmap` or perf-map-agent, LuaJIT,
.NET, Python 3.12 -X perf) write for perf: one `START SIZE name` line per
function, START and SIZE in hex. Frames named from V8's map are of kind
"js", from a JVM's "java"; a process that ran JIT code without a map is
told, once per runtime, how its runtime writes one.

The map is read when stacks are named: for counted stacks, at the end of
the run, so a map written during the run (jcmd) names what ran before.

The file grows while the program runs. It is kept open: a lookup checks it
with one fstat (still linked, same size and mtime) instead of a stat by
path, and reads only the lines appended since (a half-written last line is
left for later). A miss, or a file that was replaced or removed, checks the
path again. Later lines win for the same start (code was replaced).

A containerised process's map is read from inside its root (its /tmp,
its pid), never through a symlink out of that root. ustack runs as root
and the file is in a world-writable /tmp, so it is read only when it is
a regular file (not a FIFO that would block, not a symlink) owned by the
process's user or root; of a file past MAX_MAP_BYTES only its end (the
newest lines) is read; malformed lines are skipped. The process that writes the
map is untrusted too: what is kept is bounded (its newest MAX_ENTRIES
entries, read from the last PARSE_WINDOW bytes, names cut at MAX_NAME),
held as arrays and one blob of names rather than an object per line. What
was refused, skipped or cut is said once, in the run's warnings."""
from __future__ import annotations

import bisect
import os
import time
from array import array
import stat
from collections.abc import Callable

from ..kernel.procfs import started
from ..kernel.proc_root import foreign_root, ns_pids, open_in_root
from ..model import Frame, Mapping, printable
from ..objfile.elf import Symbol
from .normalize import is_anonymous, unnamed_jit

MAX_MAP_BYTES = 64 << 20           # a JIT's map is a few MB; a sparse 1 GB file is not one
MAX_ENTRIES = 1 << 18              # functions kept per map: the newest win
PARSE_WINDOW = 16 << 20            # bytes parsed per read, the newest (~1 s of parsing)
MAX_NAME = 1024                    # bytes of one name kept
POLL_S = 0.25                      # how often a named stack's map is checked again
_U64 = 1 << 64
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW
STALE_SLACK_S = 2.0                # a map last written this long before its process started
                                   # is an earlier process's (the start is known to ~1 s)


# The code kinds V8 prefixes its names with (node --perf-basic-prof writes
# JS:, Builtin:, BytecodeHandler:, Script:, Eval:; older V8 LazyCompile:, …)
V8_PREFIXES = ("JS:", "LazyCompile:", "Function:", "Script:", "Eval:", "Builtin:",
               "BytecodeHandler:", "RegExp:", "InterpretedFunction:")
# How each runtime writes a map, said when a process ran JIT code without one
HOW_TO_MAP = {
    "java": "run `jcmd {pid} Compiler.perfmap` while it runs (the map holds the "
            "code compiled until then), or start java with -XX:+UnlockDiagnosticVMOptions "
            "-XX:+DumpPerfMapAtExit",
    "node": "run node with --perf-basic-prof (and --interpreted-frames-native-stack "
            "to name interpreted functions too)",
    "": "a JIT writes one when asked (node --perf-basic-prof; java: jcmd PID "
        "Compiler.perfmap)",
}


def runtime(paths) -> str:
    """"java" or "node" by the files a process maps ("" for another one)."""
    for path in paths:
        base = os.path.basename(path)
        if base == "libjvm.so":
            return "java"
        if base == "node" or base.startswith("libnode.so"):
            return "node"
    return ""


def kind_of(runtime_name: str, name: str) -> str:
    """A JIT frame's kind: "java" for a JVM's map, "js" for V8's names."""
    if runtime_name == "java":
        return "java"
    return "js" if runtime_name == "node" or name.startswith(V8_PREFIXES) else ""


class JitSymbols:
    """Frames in anonymous memory, named from each process's perf map;
    `name` turns a map's name into the one shown (demangled or not);
    `paths(pid)`, when given, the files a process maps: which runtime wrote
    its map (its frames' kind) and how it would write one."""

    def __init__(self, name: Callable[[str], str], warnings: list | None = None,
                 paths: Callable[[int], list] | None = None,
                 named_otherwise: Callable[[int], bool] | None = None):
        self._name = name
        # whether a process's JIT frames were named without its perf map
        # (node's JS frames from its heap): no advice to write one
        self._named_otherwise = named_otherwise or (lambda _pid: False)
        self._warnings = warnings if warnings is not None else []
        self._paths = paths
        self._maps: dict = {}           # pid -> (PerfMap, its runtime)
        self._unmapped: dict = {}       # runtime -> (pid, PerfMap): a frame found no map
        self._stale: tuple | None = None    # (pid, PerfMap): a JVM's map lacked a frame
        self._jvm_stacks: dict = {}     # pid -> [its stacks with JIT frames, those ending there]

    def frame(self, pid: int, m: Mapping, addr: int, back: int) -> Frame:
        """Other memory without a file ([heap], [stack]) stays unnamed."""
        if is_anonymous(m.path):
            found = self._maps.get(pid)
            if found is None:
                found = self._maps[pid] = (
                    PerfMap(perf_map_path(pid), owners=_owners(pid),
                            warn=self._warnings.append, root=foreign_root(pid),
                            started=started(pid)),
                    runtime(self._paths(pid)) if self._paths is not None else "")
            perf_map, runtime_name = found
            sym = perf_map.lookup(addr - back)
            if sym is not None:
                return Frame(addr=addr, module="JIT", function=self._name(sym.name),
                             offset=addr - sym.address, size=sym.size,
                             kind=kind_of(runtime_name, sym.name))
            if not perf_map.seen:
                self._unmapped.setdefault(runtime_name, (pid, perf_map))
            elif runtime_name == "java" and self._stale is None:
                self._stale = (pid, perf_map)
        return Frame(addr=addr, module=printable(m.path), path=m.path)

    def stack_named(self, pid: int, frames, whole: bool) -> None:
        """Process `pid`'s stack `frames` (innermost first) was named;
        `whole`: no limit cut it short, its walk ended where it ends."""
        found = self._maps.get(pid)
        if found is None or found[1] != "java":
            return
        jit = [f.kind == "java" or unnamed_jit(f) for f in frames]
        if any(jit):
            seen = self._jvm_stacks.setdefault(pid, [0, 0])
            seen[0] += 1
            seen[1] += whole and jit[-1]

    def version(self, pid: int) -> int:
        """How often process `pid`'s map has changed (checked at most
        POLL_S apart): a stack named before it changed may be named better."""
        found = self._maps.get(pid)
        return found[0].poll() if found is not None else 0

    def notes(self) -> list:
        """What the user should hear about JIT code, as it stands now: once
        per runtime, a process's JIT frames found no map, with how its
        runtime writes one (or that it wrote one later, for stacks named as
        they came); a JVM's map (a snapshot, where node's grows as it
        compiles) lacked some; most of a JVM's stacks through its JIT code
        ended there."""
        said = []
        for runtime_name, (pid, perf_map) in self._unmapped.items():
            if self._named_otherwise(pid):
                continue
            who = f"PID {pid}" + (f" ({runtime_name})" if runtime_name else "")
            if perf_map.seen:            # written during the run: named since
                said.append(f"{who} wrote its perf map ({perf_map.shown}) during the "
                            f"run: the JIT frames of stacks named before are unnamed")
                continue
            said.append(f"{who} ran JIT code but wrote no perf map ({perf_map.shown}): "
                        f"its JIT frames are unnamed; "
                        f"{HOW_TO_MAP[runtime_name].format(pid=pid)}")
        if self._stale is not None:
            pid, perf_map = self._stale
            said.append(f"some JIT frames of PID {pid} (java) are not in {perf_map.shown}: "
                        f"code compiled after the map was written (or freed before); "
                        f"`jcmd {pid} Compiler.perfmap` again, later in the run, names them")
        for pid, (with_jit, ended) in self._jvm_stacks.items():
            if ended > with_jit // 2:       # most: a rare odd walk is not the JVM's flags
                said.append(f"stacks of PID {pid} (java) end in its JIT code: a JVM "
                            f"started without -XX:+PreserveFramePointer keeps no frame "
                            f"pointer there to walk on")
                break
        return said


def left_before(st: os.stat_result, process_started: float | None) -> bool:
    """Whether a perf map with this stat was last written before its
    process started: left by an earlier process that had the same pid
    (node and a JVM never remove theirs)."""
    return process_started is not None and st.st_mtime < process_started - STALE_SLACK_S


def header_hint(pid: int, maps, java_walked: bool = False, js_named: bool = False) -> str:
    """What the header of a run on running process `pid` says when it runs
    JIT code (anonymous executable memory, a JVM's or node's, `maps`) with
    no perf map yet: said at the start, while a JVM can still be asked
    for one; "" otherwise, for a JVM whose Java frames the run walks and
    names from its own tables (`java_walked`), and for node when the run
    names its JS frames from its heap (`js_named`)."""
    name = runtime(m.path for m in maps)
    if not name or not any(is_anonymous(m.path) for m in maps) or (
            java_walked and name == "java") or (js_named and name == "node"):
        return ""
    root = foreign_root(pid)
    path = perf_map_path(pid)
    try:
        if not left_before(os.lstat(path if root is None else root + path), started(pid)):
            return ""
    except OSError:
        pass
    if name == "java":
        return f"no perf map yet: `jcmd {pid} Compiler.perfmap` during the run names its JIT frames"
    return "no perf map (node --perf-basic-prof writes one): its JIT frames stay unnamed"


def _owners(pid: int) -> frozenset:
    """Who may have written process `pid`'s map: its user, or root."""
    try:
        return frozenset((0, os.stat(f"/proc/{pid}").st_uid))
    except OSError:
        return frozenset((0,))


class PerfMap:
    """`owners`: uids allowed to own the file (None: any); `warn(text)`
    hears, once each, why the file or some of its lines were not used.
    `root`: the directory `path` is in, as a container's process sees it
    (/proc/PID/root): nothing is followed out of it (no symlink, no `..`).
    `started`: when the process started (epoch seconds): a file last
    written before is another process's that had the same pid, not read."""

    def __init__(self, path: str, owners: frozenset | None = None,
                 warn: Callable[[str], None] | None = None,
                 root: str | None = None, started: float | None = None):
        self.path = path
        self.started = started
        self.root = root
        self.shown = path if root is None else root + path
        self.owners = owners
        self._warn = warn or (lambda text: None)
        self._said: set = set()          # warnings given already
        self._fd: int | None = None
        self._stamp = None               # (ino, size, mtime) when last read
        self._done = 0                   # bytes consumed: complete lines only
        self.seen = False                # the file was found (readable or not)
        self.version = 0                 # bumped when its names change
        self._next_poll = 0.0
        self._entries = _Entries()
        self._sorted = _SortedView(self._entries)

    def lookup(self, addr: int) -> Symbol | None:
        if self._fd is not None and self._current():
            sym = self._sorted.find(addr)
            if sym is not None:
                return sym
        self._refresh()
        return self._sorted.find(addr)

    def poll(self) -> int:
        """`version`, the file checked again if it was not within POLL_S."""
        now = time.monotonic()
        if now >= self._next_poll:
            self._next_poll = now + POLL_S
            self._refresh()
        return self.version

    def _current(self) -> bool:
        """Whether the open file is still the map and unchanged since read."""
        try:
            st = os.fstat(self._fd)
        except OSError:
            return False
        return st.st_nlink > 0 and (st.st_ino, st.st_size, st.st_mtime_ns) == self._stamp

    def _say(self, text: str) -> None:
        if text not in self._said:
            self._said.add(text)
            self._warn(text)

    def _refused(self, st) -> str | None:
        """Why a file with this stat must not be read, or None."""
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link"
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if self.owners is not None and st.st_uid not in self.owners:
            return f"is owned by uid {st.st_uid}, not by the process's user or root"
        return None

    def _open(self, flags: int) -> int:
        if self.root is None:
            return os.open(self.path, flags)
        return open_in_root(self.root, self.path, flags)

    def _lstat(self) -> os.stat_result:
        """The file's own stat (a symlink's, not its target's), its path
        resolved inside `root` when there is one."""
        if self.root is None:
            return os.lstat(self.path)
        fd = self._open(os.O_PATH | os.O_NOFOLLOW)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _refresh(self) -> None:
        try:
            st = self._lstat()
        except OSError:
            self._close()
            return
        if left_before(st, self.started):
            self._close()
            self._say(f"{self.shown} was last written before the process started (by an "
                      f"earlier process with the same pid): not used")
            return
        self.seen = True
        why = self._refused(st)
        if why:
            self._close()
            self._say(f"{self.shown} {why}: its JIT names are not used")
            return
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._fd is not None and stamp == self._stamp:
            return
        try:
            if self._fd is None or self._stamp is None or stamp[0] != self._stamp[0]:
                self._close()
                self._fd = self._open(_OPEN_FLAGS)
                st = os.fstat(self._fd)     # the file opened, if it changed again
                if self._refused(st):       # swapped since the lstat
                    self._close()
                    return
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            elif stamp[1] <= self._stamp[1]:
                self._forget()              # not grown, yet changed: rewritten
            self._stamp = stamp
            self._read_tail(stamp[1])
        except OSError:
            self._close()

    def _read_tail(self, size: int) -> None:
        """Parse the complete lines between what was read and size: at
        most the last PARSE_WINDOW bytes of them (older lines are skipped
        whole, as a map with more entries than are kept would lose them)."""
        at = self._done
        if size - at > PARSE_WINDOW:
            # a JIT appends: its newest functions, the ones running, are at
            # the end (a map past MAX_MAP_BYTES was read from its start and
            # lost them)
            self._say(f"{self.shown} is larger than {MAX_MAP_BYTES >> 20} MiB: only its "
                      "newest names are used" if size > MAX_MAP_BYTES else
                      f"{self.shown} holds more than {PARSE_WINDOW >> 20} MiB of "
                      "names: only its newest ones are used")
            at = self._line_start(size - PARSE_WINDOW)
            if at < 0:
                self._done = size        # one line longer than the window: no name
                return
            self._entries.clear()        # all of them older than what follows
        entries = self._entries
        skipped = 0
        rest = b""
        while at < size:
            chunk = os.pread(self._fd, min(size - at, 1 << 20), at)
            if not chunk:
                break
            at += len(chunk)
            data = rest + chunk
            end = data.rfind(b"\n") + 1        # a half-written last line waits
            rest = data[end:]
            if end:
                self._done = at - len(rest)
                skipped += entries.parse(data, end)
        if skipped:
            self._say(f"{self.shown}: malformed lines skipped")
        if entries.dropped:
            self._say(f"{self.shown} has more than {MAX_ENTRIES:,} entries: only "
                      "the newest are used")
        self._sorted.rebuild()
        self.version += 1

    def _line_start(self, at: int) -> int:
        """The offset of the first line that starts at or after `at`
        (-1: none within the next MiB)."""
        window = os.pread(self._fd, 1 << 20, at - 1) if at else b"\n"
        i = window.find(b"\n")
        return -1 if i < 0 else at + i

    def _forget(self) -> None:
        if len(self._entries):
            self.version += 1
        self._done = 0
        self._entries.clear()
        self._sorted.rebuild()

    def _close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
        self._fd, self._stamp = None, None
        self._forget()

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass


class _Entries:
    """A map's entries in the order of its lines: starts, sizes and the
    offsets of their names in one blob; at most MAX_ENTRIES, the oldest
    dropped first (a JIT appends what it compiled last)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.starts = array("Q")
        self.sizes = array("Q")
        self.name_at = array("Q")           # where each name starts in `names`
        self.names = bytearray()
        self.dropped = 0                    # entries dropped for the cap

    def __len__(self) -> int:
        return len(self.starts)

    def name(self, i: int) -> str:
        at = self.name_at
        end = at[i + 1] if i + 1 < len(at) else len(self.names)
        return self.names[at[i]:end].decode(errors="replace")

    def parse(self, data: bytes, end: int) -> int:
        """Add the `START SIZE name` lines of data[:end]; the number skipped."""
        starts, sizes, name_at, names = self.starts, self.sizes, self.name_at, self.names
        skipped = 0
        for line in data[:end].split(b"\n"):
            parts = line.split(b" ", 2)
            try:
                start, size = int(parts[0], 16), int(parts[1], 16)
            except (ValueError, IndexError):
                if line:
                    skipped += 1
                continue
            name = parts[2].rstrip(b"\r") if len(parts) == 3 else b""
            if not name or not 0 < size < _U64 or not 0 <= start < _U64 - size:
                skipped += 1
                continue
            starts.append(start)
            sizes.append(size)
            name_at.append(len(names))
            names += name[:MAX_NAME]
        if len(starts) >= 2 * MAX_ENTRIES:
            self._keep_newest(MAX_ENTRIES)
        return skipped

    def _keep_newest(self, n: int) -> None:
        cut = len(self.starts) - n
        if cut <= 0:
            return
        at = self.name_at[cut]
        self.starts = self.starts[cut:]
        self.sizes = self.sizes[cut:]
        self.name_at = array("Q", (x - at for x in self.name_at[cut:]))
        del self.names[:at]
        self.dropped += cut

    def trim(self) -> None:
        self._keep_newest(MAX_ENTRIES)


class _SortedView:
    """The entries by start address, one per start (the latest line wins:
    the code there was replaced), for bisecting."""

    def __init__(self, entries: _Entries):
        self.entries = entries
        self.starts = array("Q")
        self.index = array("L")             # position in `entries`

    def rebuild(self) -> None:
        entries = self.entries
        entries.trim()
        starts = entries.starts
        order = sorted(range(len(starts)), key=starts.__getitem__)   # stable
        self.starts = array("Q")
        self.index = array("L")
        for k, i in enumerate(order):
            if k + 1 < len(order) and starts[order[k + 1]] == starts[i]:
                continue                    # a later line has this start
            self.starts.append(starts[i])
            self.index.append(i)

    def find(self, addr: int) -> Symbol | None:
        k = bisect.bisect_right(self.starts, addr) - 1
        if k < 0:
            return None
        entries = self.entries
        i = self.index[k]
        start = entries.starts[i]
        size = entries.sizes[i]
        if addr < start + size:
            return Symbol(entries.name(i), start, size)
        return None


def perf_map_path(pid: int) -> str:
    """Where the JIT of process `pid` writes its map, as it sees it: in its
    own /tmp (its root's: see foreign_root), named by its pid in its own
    pid namespace (a container's process writes /tmp/perf-7.map)."""
    inner = ns_pids(pid)
    return f"/tmp/perf-{inner[-1] if inner else pid}.map"
