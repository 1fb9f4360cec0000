"""What a run was asked to do: the CLI fills it in, a script may too."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .defaults import DEFAULT_STACK_SIZE, DEFAULT_STACK_STORAGE
from .model import SymbolOptions


@dataclass
class Options:
    command: str = "trace"                 # trace | count | profile | funccount
    events: list = field(default_factory=list)   # EVENT specs, as typed
    pid: Optional[int] = None              # -p: scope is that process
    pids: tuple = ()                       # -p 1,2,3: all processes, only these kept
    tids: frozenset = frozenset()          # --tid: only these threads
    comms: frozenset = frozenset()         # --comm: only threads of these names
    container_pid: Optional[int] = None    # --container-pid: uprobe paths in its root
    include_idle: bool = False             # --include-idle: keep pid 0's samples
    cmdline: Optional[str] = None          # -c: scope is that command, started by us
    duration: Optional[float] = None       # -d: seconds, else until Ctrl-C or exit
    output_format: Optional[str] = None    # a report.formats name; None: by -o's name, else text
    output_path: Optional[str] = None      # -o: results there, not on stdout
    per_pid: bool = False
    per_thread: bool = False               # -T: count each thread separately
    offsets: bool = False                  # count: keep call sites apart
    buffer_pages: Optional[int] = None     # None: sized for the unwinder
    unwind: str = "auto"                   # auto | fp | dwarf
    stack_size: int = DEFAULT_STACK_SIZE
    symbols: SymbolOptions = SymbolOptions()
    backend: str = "auto"                  # auto | perf | bpf | tracefs
    kernel_stacks: bool = False            # --kernel (bpf only)
    stack_storage: int = DEFAULT_STACK_STORAGE   # --stack-storage-size
    interval: Optional[float] = None       # funccount -i
    record: Optional[str] = None           # record, count/profile --record: save to FILE
    raw_stacks: bool = False               # record --raw-stacks: DWARF stacks as copied
    offcpu: Optional[object] = None        # offcpu: capture.bpf_offcpu.OffcpuFilter
