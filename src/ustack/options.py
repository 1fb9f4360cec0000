"""What a run was asked to do, and the checks of each option: the commands
fill it in from their parsed arguments (run_options), a script may too."""
from __future__ import annotations

import os

from .defaults import DEFAULT_STACK_SIZE, DEFAULT_STACK_STORAGE, MAX_STACK_SIZE
from .model import SymbolOptions, UstackError
from .values import factory, value


@value(frozen=False)
class Options:
    command: str = "trace"                 # the subcommand: trace, count, record, …
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
    unwind_memory: int | None = None    # --unwind-memory, bytes; None: sized by the targets
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
    js: bool = True                        # --no-js: node's JS frames not named from its heap
    php: bool = True                       # --no-php: no PHP frames in native stacks
    perl: bool = True                      # --no-perl: no Perl frames in native stacks
    ruby: bool = True                      # --no-ruby: a Ruby process's VM calls as C frames only
    weight: str | None = None           # count --weight EXPR: sum it per stack, not hits
    every: float | None = None          # profile --every S: a pprof per S seconds into -o DIR/
    to: object | None = None            # --every --to: commands.every.SinkRequest
    host: str = ""                      # --every: this machine's label, in files and rows

    @property
    def js_named(self) -> bool:
        """Whether the in-kernel walk names node's JS frames (bpf/v8.h); a
        recording keeps their names (recording/format.py's I records)."""
        return self.js

    @property
    def java_walked(self) -> bool:
        """Whether a JVM's copied stacks are walked through its Java frames
        (unwind/hotspot_live.py); a recording keeps their names
        (recording/format.py's I records)."""
        return self.symbols.java

    @property
    def php_named(self) -> bool:
        """Whether the in-kernel walk merges PHP frames (bpf/php.h); a
        recording keeps their names (recording/format.py's I records)."""
        return self.php

    @property
    def perl_merged(self) -> bool:
        """Whether the in-kernel walk merges Perl frames (bpf/perl.h); a
        recording keeps their names (recording/format.py's I records)."""
        return self.perl

    @property
    def ruby_named(self) -> bool:
        """Whether the in-kernel walk merges Ruby frames (bpf/ruby.h); a
        recording keeps their names (recording/format.py's I records)."""
        return self.ruby

    @property
    def runs_as(self) -> str:
        """What the run does with its events: record traces, or counts
        where the kernel counts (bpf), and its recording says which."""
        if self.command == "record":
            return "count" if self.backend == "bpf" else "trace"
        return self.command


def run_options(args) -> Options:
    """The Options of a run from the arguments every run takes
    (commands/arguments.py's target_args, backend_arg, output_args), checked."""
    check_buffer_pages(args.buffer_pages)
    check_duration(args.duration)
    check_stack_size(args.stack_size)
    unwind_memory = unwind_memory_bytes(getattr(args, "unwind_memory", None))
    pids = args.pid or ()
    return Options(command=args.cmd, pid=pids[0] if len(pids) == 1 else None,
                   pids=pids if len(pids) > 1 else (), cmdline=args.command,
                   tids=frozenset(args.tid or ()), container_pid=args.container_pid,
                   comms=frozenset(c for c in (args.comm or "").split(",") if c),
                   include_idle=args.include_idle,
                   duration=args.duration, buffer_pages=args.buffer_pages,
                   unwind=args.unwind, stack_size=args.stack_size // 8 * 8,
                   unwind_memory=unwind_memory,
                   symbols=symbol_options(args),
                   backend=args.backend, output_path=args.output,
                   every_process=getattr(args, "every_process", False),
                   output_format=getattr(args, "format", None),
                   unsafe_address=getattr(args, "unsafe_address", False),
                   python=not getattr(args, "no_python", False),
                   js=not getattr(args, "no_js", False),
                   php=not getattr(args, "no_php", False),
                   perl=not getattr(args, "no_perl", False),
                   ruby=not getattr(args, "no_ruby", False))


def symbol_options(args) -> SymbolOptions:
    """--lines, --inlines, --no-demangle, --debug-dir, --debuginfod, -v."""
    return SymbolOptions(lines=args.lines, inlines=args.inlines,
                         demangle=not args.no_demangle,
                         debug_dirs=tuple(args.debug_dir),
                         debuginfod=tuple(getattr(args, "debuginfod", None) or
                                          os.environ.get("DEBUGINFOD_URLS", "").split()),
                         name_sources=bool(getattr(args, "verbose", False)),
                         java=not getattr(args, "no_java", False))


def check_target(pid: int | None, cmdline: str | None) -> None:
    if pid is not None and cmdline is not None:
        raise UstackError("use either -p PID or -c CMD, not both")
    if cmdline is not None and not cmdline.strip():
        raise UstackError("-c needs a command (an empty one would trace "
                          "the whole system)")


def check_buffer_pages(pages: int | None) -> None:
    if pages is not None and (pages <= 0 or pages & (pages - 1)):
        raise UstackError("--buffer-pages must be a power of two")


def check_duration(seconds: float | None) -> None:
    if seconds is not None and not 0 < seconds < float("inf"):
        raise UstackError("--duration must be a positive number of seconds")


def check_stack_size(size: int) -> None:
    if not 8 <= size <= MAX_STACK_SIZE:
        raise UstackError(f"--stack-size must be between 8 and {MAX_STACK_SIZE} bytes")


def unwind_memory_bytes(mib: float | None) -> int | None:
    """--unwind-memory MIB in bytes (None: not given)."""
    if mib is None:
        return None
    if not 0 < mib <= 1 << 16:
        raise UstackError("--unwind-memory must be between 0 and 65536 MiB")
    return max(4096, int(mib * (1 << 20)))


def check_stack_storage(n: int) -> None:
    if n <= 0:
        raise UstackError("--stack-storage-size must be positive")


def check_interval(seconds: float | None) -> None:
    if seconds is not None and seconds <= 0:
        raise UstackError("-i must be a positive number of seconds")


def check_frequency(hz: int) -> None:
    """-F within what the kernel takes (else perf_event_open says EINVAL)."""
    if hz <= 0:
        raise UstackError("-F must be a positive frequency")
    from .kernel.perf_event import MAX_SAMPLE_RATE, max_sample_rate
    limit = max_sample_rate()
    if limit is not None and hz > limit:
        raise UstackError(f"-F {hz} is above the kernel's limit of {limit} samples/s "
                          f"({MAX_SAMPLE_RATE}): lower -F, or raise the limit "
                          f"with `sysctl kernel.perf_event_max_sample_rate={hz}`")


def check_kernel_stacks(kernel: bool, backend: str) -> None:
    if kernel and backend not in ("auto", "bpf"):
        raise UstackError(f"--kernel needs in-kernel counting (--backend bpf), "
                          f"not --backend {backend}")
