"""Plain data passed between the stages (see DESIGN.md: probes -> target ->
capture -> unwind -> symbolize -> report). No stage logic lives here."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class UstackError(Exception):
    """An error the user can act on: printed as one line, exit status 1."""


# --- probes ---------------------------------------------------------------

@dataclass(frozen=True)
class ProbeSpec:
    """One EVENT as the user spelled it, parsed but not yet resolved."""
    kind: str                      # uprobe | uretprobe | syscall | tracepoint | profile
    text: str                      # the original spelling, for messages
    path: Optional[str] = None     # uprobe: binary path or library name
    function: Optional[str] = None  # uprobe: symbol name or glob
    offset: int = 0                # uprobe: +0xOFF after the function
    address: Optional[int] = None  # uprobe: PATH:0xADDR (ELF virtual address)
    group: Optional[str] = None    # tracepoint group (syscalls for syscall:)
    name: Optional[str] = None     # tracepoint / syscall name, may be a glob
    hz: Optional[int] = None       # profile frequency
    args: tuple = ()               # uprobe fetch-args: (name, fetch, type) triples


@dataclass(frozen=True)
class UprobeTarget:
    """A resolved uprobe: where the kernel puts the breakpoint."""
    spec: ProbeSpec
    path: str                      # real file on this host
    file_offset: int               # what uprobe_events / the uprobe PMU take
    address: int                   # ELF virtual address of the probed instruction
    symbol: Optional[str]          # enclosing function, if known
    symbol_offset: int             # address - symbol start
    # Where the return address sits at the probed instruction, as a word
    # index from sp, when the frame pointer chain does not yet include it
    # (function entry, before `mov %rsp,%rbp`). None: the chain is complete.
    return_address_slot: Optional[int]
    label: str                     # event name shown to the user
    fetch_args: tuple = ()         # 'name=fetch[:type]' words for uprobe_events


@dataclass(frozen=True)
class TracepointTarget:
    spec: ProbeSpec
    group: str
    name: str
    label: str


@dataclass(frozen=True)
class ProfileTarget:
    spec: ProbeSpec
    hz: int
    label: str


# --- target ---------------------------------------------------------------

@dataclass(frozen=True)
class Mapping:
    """One executable mapping of a process, as in /proc/PID/maps or MMAP2."""
    start: int
    end: int
    pgoff: int                     # file offset of `start`
    path: str                      # path as the process sees it
    host_path: str = ""            # where this tool can open it ("" = path)

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end

    @property
    def open_path(self) -> str:
        return self.host_path or self.path


# --- capture --------------------------------------------------------------

@dataclass
class Sample:
    """One event as captured: where it happened and the raw user stack.

    Frame-pointer capture fills `ips` (innermost first, as the kernel walked
    them). DWARF capture fills `regs` and `stack` instead; the unwind stage
    turns either into addresses."""
    event: str
    time_ns: int
    pid: int
    tid: int
    cpu: int
    ips: tuple = ()
    stack: Optional[bytes] = None  # user stack copied from sp upward (bytes-like)
    regs: Optional[dict] = None    # user registers by name ('ip', 'sp', 'bp', ...)
    return_address_slot: Optional[int] = None  # see UprobeTarget


@dataclass(frozen=True)
class MmapEvent:
    pid: int
    tid: int
    mapping: Mapping


@dataclass(frozen=True)
class CommEvent:
    pid: int
    tid: int
    comm: str
    exec: bool                     # True when the comm changed through execve


@dataclass(frozen=True)
class ForkEvent:
    pid: int
    ppid: int
    tid: int
    ptid: int




# --- unwind / symbolize ---------------------------------------------------

@dataclass(frozen=True)
class Frame:
    """One symbolized frame. `offset` is addr - function start, as perf and
    SystemTap print it; `size` is the function's size (0 if unknown). An
    inlined frame shares `addr` with the frame it was inlined into, which
    follows it in the stack."""
    addr: int
    module: str                    # basename of the mapped file, '' if unknown
    function: Optional[str] = None
    offset: int = 0
    size: int = 0
    path: str = ""
    file: str = ""                 # source file, when lines were asked for
    line: int = 0                  # 0: unknown
    inlined: bool = False          # a call inlined into the frame that follows

    @property
    def name(self) -> str:
        return self.function if self.function else f"0x{self.addr:x}"


@dataclass(frozen=True)
class Stack:
    """A symbolized user stack, innermost frame first."""
    frames: tuple
    notes: tuple = ()              # what went wrong while unwinding, for the user


@dataclass
class StackCount:
    """What the report stage aggregates: a stack seen `count` times. A BPF
    backend produces these directly; the perf backend counts samples."""
    comm: str
    pid: int
    stack: Stack
    count: int
    event: str = ""
