"""What a run was asked to do: the CLI fills it in, a script may too."""
from __future__ import annotations


from .defaults import DEFAULT_STACK_SIZE, DEFAULT_STACK_STORAGE
from .model import SymbolOptions
from .values import factory, value


@value(frozen=False)
class Options:
    command: str = "trace"                 # trace | count | profile | funccount
    events: list = factory(list)   # EVENT specs, as typed
    pid: int | None = None              # -p: scope is that process
    pids: tuple = ()                       # -p 1,2,3: all processes, only these kept
    tids: frozenset = frozenset()          # --tid: only these threads
    comms: frozenset = frozenset()         # --comm: only threads of these names
    container_pid: int | None = None    # --container-pid: uprobe paths in its root
    include_idle: bool = False             # --include-idle: keep pid 0's samples
    cmdline: str | None = None          # -c: scope is that command, started by us
    duration: float | None = None       # -d: seconds, else until Ctrl-C or exit
    output_format: str | None = None    # a report.formats name; None: by -o's name, else text
    output_path: str | None = None      # -o: results there, not on stdout
    per_pid: bool = False
    per_thread: bool = False               # -T: count each thread separately
    offsets: bool = False                  # count: keep call sites apart
    buffer_pages: int | None = None     # None: sized for the unwinder
    unwind: str = "auto"                   # auto | fp | dwarf
    stack_size: int = DEFAULT_STACK_SIZE
    symbols: SymbolOptions = SymbolOptions()
    backend: str = "auto"                  # auto | perf | bpf | tracefs
    every_process: bool = False            # -a: tracefs globs over a library allowed
    kernel_stacks: bool = False            # --kernel (bpf only)
    stack_storage: int = DEFAULT_STACK_STORAGE   # --stack-storage-size
    interval: float | None = None       # funccount -i
    record: str | None = None           # record, count/profile --record: save to FILE
    raw_stacks: bool = False               # record --raw-stacks: DWARF stacks as copied
    offcpu: object | None = None        # offcpu: capture.bpf_offcpu.OffcpuFilter
    unsafe_address: bool = False           # --unsafe-address: probe unproven addresses too
    python: bool = True                    # --no-python: no Python frames in native stacks
