"""The `ustack` command: parses arguments and hands them to the stages."""
from __future__ import annotations

import argparse
import os
import sys

from .defaults import (DEFAULT_BUFFER_PAGES, DEFAULT_RECORDING, DEFAULT_STACK_SIZE,
                       DEFAULT_STACK_STORAGE, DWARF_BUFFER_PAGES, MAX_STACK_SIZE)
from .interrupt import Interrupted
from .model import UstackError
from .report.formats import EVENT_FORMATS, EXTENSIONS, FORMATS

EVENT_HELP = ("syscall:write  syscall:*  uprobe:PATH:FUNC[+OFF]  uprobe:PATH:0xADDR  "
              "uretprobe:PATH:FUNC  tracepoint:GROUP:NAME  profile:hz:N")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kw):
        # no abbreviations: `--comm` must not be taken for `--command`
        super().__init__(*args, allow_abbrev=False, **kw)

    def error(self, message):             # one line, not usage + message
        raise UstackError(f"{message} (see `{self.prog} --help`)")

    def _get_formatter(self):
        # argparse makes a formatter for every add_argument, and one left
        # to find its width imports shutil (with bz2 and lzma: ~1.5 ms)
        return self.formatter_class(prog=self.prog, width=_help_width())


def _help_width() -> int:
    """The terminal's columns as argparse would find them, less its margin."""
    try:
        columns = int(os.environ.get("COLUMNS", 0))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 80
    return (columns or 80) - 2


def _target_args(p: argparse.ArgumentParser) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("-p", "--pid", type=_pid_list, metavar="PID[,PID…]",
                     help="trace this process (all its threads); several: "
                          "their events among all processes' (decimal, as perf "
                          "takes them: 007 is 7)")
    who.add_argument("-c", "--command", metavar="CMD",
                     help="start CMD and trace it (and its children) until it exits")
    p.add_argument("--tid", type=_pid_list, metavar="TID[,TID…]",
                   help="keep only these threads' events")
    p.add_argument("--comm", metavar="NAME[,NAME…]",
                   help="keep only the events of threads of these names")
    p.add_argument("--container-pid", type=int, metavar="PID",
                   help="uprobe paths are as process PID sees them (its "
                        "container's root); without -p every process that "
                        "maps the file is traced")
    p.add_argument("--include-idle", action="store_true",
                   help="system-wide: keep the idle task's samples, as [idle]")
    p.add_argument("-d", "--duration", type=float, metavar="SECONDS",
                   help="stop after SECONDS (default: until Ctrl-C or the target exits)")
    p.add_argument("--buffer-pages", type=int, metavar="N",
                   help="perf ring buffer pages per CPU, a power of two (default "
                        f"{DEFAULT_BUFFER_PAGES}, or {DWARF_BUFFER_PAGES} when "
                        "stacks are copied for DWARF)")
    p.add_argument("--unwind", choices=("auto", "fp", "dwarf"), default="auto",
                   help="dwarf: unwind with the binaries' CFI (Go: its pclntab), "
                        "in the kernel where BPF allows, else on a copy of the "
                        "stack; fp: the kernel walks frame pointers; auto "
                        "(default): dwarf")
    p.add_argument("--no-python", action="store_true",
                   help="show a Python process's interpreter as C frames only "
                        "(default: its Python functions' frames, name and line, "
                        "where the interpreter ran them; CPython 3.8-3.13, "
                        "--backend bpf)")
    p.add_argument("--stack-size", type=int, default=DEFAULT_STACK_SIZE, metavar="BYTES",
                   help="user stack bytes copied per event for DWARF unwinding "
                        f"(default {DEFAULT_STACK_SIZE}, at most {MAX_STACK_SIZE})")
    _symbol_args(p)


_BACKEND_HELP = {
    "auto": "auto (default): bpf where it works, else perf",
    "perf": "perf: perf events, stacks walked by the kernel (fp) or copied out "
            "(dwarf)",
    "bpf": "bpf: stacks unwound and counted in the kernel",
    "tracefs": "tracefs: ftrace alone, in a private instance (no perf events "
               "or BPF needed)",
}


def _unsafe_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unsafe-address", action="store_true",
                   help="also place uprobes at addresses ustack cannot prove to "
                        "be instruction starts (no symbol or CFI before them); "
                        "one inside an instruction corrupts the target")


def _backend_arg(p: argparse.ArgumentParser, *choices: str) -> None:
    p.add_argument("--backend", choices=("auto",) + choices, default="auto",
                   help="; ".join(_BACKEND_HELP[c] for c in ("auto",) + choices))
    if "tracefs" in choices:
        p.add_argument("-a", "--every-process", action="store_true",
                       help="tracefs: allow a uprobe glob over a library with -p/-c "
                            "(tracefs uprobes fire in every process that maps the "
                            "file, not only in the target)")


def _symbol_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lines", action="store_true",
                   help="add the source file:line of each frame")
    p.add_argument("--inlines", action="store_true",
                   help="show inlined calls as frames of their own (marked inlined)")
    p.add_argument("--no-demangle", action="store_true",
                   help="print C++ and Rust names as they are in the binary")
    p.add_argument("--debug-dir", action="append", default=[], metavar="DIR",
                   help="also look for separate debug files in DIR (repeatable)")


def _symbol_options(args):
    from .model import SymbolOptions
    return SymbolOptions(lines=args.lines, inlines=args.inlines,
                         demangle=not args.no_demangle,
                         debug_dirs=tuple(args.debug_dir))


def _output_args(p: argparse.ArgumentParser, table: dict) -> None:
    endings = ", ".join(f"{e} {n}" for e, n in EXTENSIONS.items() if n in table)
    p.add_argument("-f", "--format", choices=tuple(table), metavar="FORMAT",
                   help=f"one of {', '.join(table)} (default: from -o's file name "
                        f"({endings}), else text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the results to FILE, not stdout (a traced "
                        "command's own output stays on the terminal)")


def _count_args(p: argparse.ArgumentParser) -> None:
    _output_args(p, FORMATS)
    p.add_argument("-P", "--per-pid", action="store_true",
                   help="count each process separately")
    p.add_argument("-T", "--per-thread", action="store_true",
                   help="count each thread separately (implies -P)")
    p.add_argument("--offsets", action="store_true",
                   help="tell call sites apart: frames as func+0xOFF/0xSIZE")
    p.add_argument("--kernel", action="store_true",
                   help="add kernel stacks (bpf), above the user frames after `--`")
    p.add_argument("--stack-storage-size", type=int, default=DEFAULT_STACK_STORAGE,
                   metavar="N", help="distinct stacks the kernel can keep (bpf, "
                                     f"default {DEFAULT_STACK_STORAGE})")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `only` the one subcommand a run
    names: building all twelve costs ~8 ms of start-up (argparse and
    gettext), for a --help that lists them."""
    parser = _Parser(prog="ustack",
                     description="User-space call stacks of Linux processes.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"ustack {__version__}")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    builders = _SUBCOMMANDS if only is None else {only: _SUBCOMMANDS[only]}
    for build in dict.fromkeys(builders.values()):    # each once, in order
        build(sub)
    return parser


def _trace_parser(sub) -> None:
    p = sub.add_parser("trace", help="print a stack for every event",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="+", metavar="EVENT")
    _unsafe_arg(p)
    _target_args(p)
    _backend_arg(p, "perf", "bpf", "tracefs")
    _output_args(p, EVENT_FORMATS)


def _count_parser(sub) -> None:
    p = sub.add_parser("count", help="count stacks by frequency",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="+", metavar="EVENT")
    _unsafe_arg(p)
    _target_args(p)
    _backend_arg(p, "perf", "bpf", "tracefs")
    _count_args(p)
    _record_arg(p)


def _profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="sample on-CPU stacks at a frequency")
    p.add_argument("-F", "--frequency", type=int, default=49, metavar="HZ",
                   help="samples per second per CPU (default 49)")
    _target_args(p)
    _backend_arg(p, "perf", "bpf")
    _count_args(p)
    _record_arg(p)


def _symbolize_parser(sub) -> None:
    p = sub.add_parser("symbolize", help="name the user frames of saved ftrace "
                       "output (userstacktrace)",
                       description="Print TRACE_FILE (ftrace's `trace` text with the "
                       "userstacktrace option) with each user frame named.")
    p.add_argument("trace_file", metavar="TRACE_FILE", help="saved trace ('-': stdin)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("-p", "--pid", type=int, help="the traced process, still running")
    src.add_argument("--maps", metavar="MAPS_FILE",
                     help="a saved copy of the traced process's /proc/PID/maps")
    src.add_argument("--binary", metavar="PATH",
                     help="addresses are PATH's own (a non-PIE executable)")
    _symbol_args(p)


def _funccount_parser(sub) -> None:
    p = sub.add_parser("funccount", help="count calls of functions, in the kernel",
                       description="PATTERN: PATH:GLOB (bcc funccount), e.g. "
                                   "'libc:mem*' or '/bin/prog:do_*'")
    p.add_argument("pattern", metavar="PATH:GLOB")
    _unsafe_arg(p)
    p.add_argument("-i", "--interval", type=float, metavar="SECONDS",
                   help="print and reset the counts every SECONDS")
    _target_args(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the counts to FILE, not stdout")
    p.set_defaults(backend="bpf")         # counts in the kernel, nothing else


def _list_parser(sub) -> None:
    p = sub.add_parser("list", help="list traceable functions of a binary")
    p.add_argument("binary")
    p.add_argument("pattern", nargs="?", help="glob, e.g. 'mem*'")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="each function's parameters and types (DWARF), as bpftrace -lv")


def _dump_parser(sub) -> None:
    p = sub.add_parser("dump", help="every thread's stack once, native and Python "
                       "(pstack, py-spy dump)",
                       description="Stop each thread of PID for a moment (ptrace), "
                       "read its registers and stack, let it go on, then print its "
                       "frames innermost first.")
    p.add_argument("-p", "--pid", type=int, required=True, help="the process")
    p.add_argument("-f", "--format", choices=("text", "json"),
                   help="text or json (default: json for a -o file ending .json, else text)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    _symbol_args(p)


def _offcpu_parser(sub) -> None:
    p = sub.add_parser("offcpu", help="stacks where threads block, weighted by the "
                       "time off the CPU (bcc offcputime/offwaketime)",
                       description="Stacks at the moment a thread left the CPU, "
                       "weighted by how long it stayed off it, summed in the kernel "
                       "(sched:sched_switch; DWARF unwinding in the kernel).")
    _target_args(p)
    _count_args(p)
    p.add_argument("--min-block", type=float, metavar="US",
                   help="count only blocks of at least US microseconds (default 1)")
    p.add_argument("--max-block", type=float, metavar="US",
                   help="count only blocks of at most US microseconds")
    p.add_argument("--state", nargs="+", metavar="STATE",
                   help="count only threads leaving the CPU in these states: R "
                        "(preempted), S (sleeping), D (uninterruptible), T, t, X, "
                        "Z, P, I (default: all)")
    p.add_argument("--wakers", action="store_true",
                   help="add the stack of the thread that woke each one, above "
                        "a `[woken by]` frame (offwaketime)")
    p.set_defaults(backend="bpf")         # sums in the kernel, nothing else


def _memleak_parser(sub) -> None:
    p = sub.add_parser("memleak", help="allocations not freed, by stack (bcc memleak)",
                       description="libc's allocators and frees probed in the target, "
                       "the blocks not freed and their bytes per stack kept in the "
                       "kernel (DWARF unwinding in the kernel); largest first.")
    _target_args(p)
    _output_args(p, FORMATS)
    p.add_argument("-i", "--interval", type=float, metavar="SECONDS",
                   help="also print the outstanding allocations every SECONDS")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="print the N stacks holding the most bytes (default 10)")
    p.add_argument("--older", type=float, metavar="MS",
                   help="count only allocations at least MS milliseconds old")
    p.add_argument("--stack-storage-size", type=int, default=DEFAULT_STACK_STORAGE,
                   metavar="N", help="distinct stacks the kernel can keep "
                                     f"(default {DEFAULT_STACK_STORAGE})")
    p.set_defaults(backend="bpf")         # tables in the kernel, nothing else


def _run(args) -> int:
    if args.cmd in ("report", "archive"):
        return _run_report(args)
    if args.cmd == "list":
        from .commands.list import list_text
        sys.stdout.write(list_text(args.binary, args.pattern, args.verbose))
        return 0
    if args.cmd == "dump":
        from .commands.dump import run_dump
        return run_dump(args.pid, _symbol_options(args), args.format, args.output, sys.stderr)
    if args.cmd == "symbolize":
        from .commands.symbolize import symbolize_trace
        return symbolize_trace(args.trace_file, pid=args.pid, maps_file=args.maps,
                               binary=args.binary, options=_symbol_options(args))
    from .commands.run import run
    from .options import Options
    if args.buffer_pages is not None and (
            args.buffer_pages <= 0 or args.buffer_pages & (args.buffer_pages - 1)):
        raise UstackError("--buffer-pages must be a power of two")
    if args.duration is not None and not 0 < args.duration < float("inf"):
        raise UstackError("--duration must be a positive number of seconds")
    if not 8 <= args.stack_size <= MAX_STACK_SIZE:
        raise UstackError(f"--stack-size must be between 8 and {MAX_STACK_SIZE} bytes")
    pids = args.pid or ()
    opts = Options(command=args.cmd, pid=pids[0] if len(pids) == 1 else None,
                   pids=pids if len(pids) > 1 else (), cmdline=args.command,
                   tids=frozenset(args.tid or ()), container_pid=args.container_pid,
                   comms=frozenset(c for c in (args.comm or "").split(",") if c),
                   include_idle=args.include_idle,
                   duration=args.duration, buffer_pages=args.buffer_pages,
                   unwind=args.unwind, stack_size=args.stack_size // 8 * 8,
                   symbols=_symbol_options(args),
                   backend=args.backend, output_path=args.output,
                   every_process=getattr(args, "every_process", False),
                   output_format=getattr(args, "format", None),
                   unsafe_address=getattr(args, "unsafe_address", False),
                   python=not getattr(args, "no_python", False))
    if args.cmd == "offcpu":
        from .commands.offcpu import offcpu_filter, offcpu_options, run_offcpu
        flt = offcpu_filter(args.min_block, args.max_block, args.state, args.wakers)
        if args.unwind == "fp":
            raise UstackError("offcpu unwinds with DWARF in the kernel; --unwind fp "
                              "is not an option here")
        if args.stack_storage_size <= 0:
            raise UstackError("--stack-storage-size must be positive")
        opts.per_pid, opts.offsets = args.per_pid, args.offsets
        opts.kernel_stacks, opts.stack_storage = args.kernel, args.stack_storage_size
        return run_offcpu(offcpu_options(opts, flt))
    if args.cmd == "memleak":
        from .commands.memleak import MemleakRequest, run_memleak
        if args.stack_storage_size <= 0:
            raise UstackError("--stack-storage-size must be positive")
        opts.stack_storage = args.stack_storage_size
        return run_memleak(opts, MemleakRequest(args.interval, args.top, args.older))
    if args.cmd == "profile":
        _check_frequency(args.frequency)
        opts.events = [f"profile:hz:{args.frequency}"]
    elif args.cmd == "funccount":
        if args.tid or args.comm:
            raise UstackError("funccount counts calls in the kernel per function: "
                              "it takes -p PID (or a list), not --tid or --comm")
        _funccount_options(args, opts)
    elif args.cmd == "record":
        _record_options(args, opts)
    else:
        opts.events = args.events
    if args.cmd == "latency":
        opts.stack_storage = args.stack_storage_size
    if args.cmd in ("count", "profile"):
        opts.per_pid = args.per_pid or args.per_thread
        opts.per_thread = args.per_thread
        opts.offsets = args.offsets
        opts.kernel_stacks = args.kernel
        if args.kernel and args.backend not in ("auto", "bpf"):
            raise UstackError(f"--kernel needs in-kernel counting (--backend bpf), "
                              f"not --backend {args.backend}")
        if args.stack_storage_size <= 0:
            raise UstackError("--stack-storage-size must be positive")
        opts.stack_storage = args.stack_storage_size
        opts.record = args.record
    if args.cmd == "record":
        from .commands.record import record
        return record(opts, archive=args.archive)
    if args.cmd == "latency":
        from .commands.latency import LatencyRequest, run_latency
        return run_latency(opts, LatencyRequest(args.by_stack, args.slower, args.units,
                                                args.ret_sites))
    return run(opts)


def _latency_parser(sub) -> None:
    p = sub.add_parser("latency", help="histograms of the time from entry to "
                       "return of functions and syscalls, counted in the kernel",
                       description="EVENT: uprobe:PATH:FUNC (a glob: one histogram "
                       "per function) or syscall:NAME")
    p.add_argument("events", nargs="+", metavar="EVENT")
    _unsafe_arg(p)
    _target_args(p)
    p.add_argument("--by-stack", action="store_true",
                   help="a histogram per calling stack (unwound in the kernel)")
    p.add_argument("--slower", type=float, metavar="MS",
                   help="print each call that took at least MS milliseconds, "
                        "with its stack, instead of histograms (funcslower)")
    p.add_argument("--units", choices=("ns", "us", "ms"), default="us",
                   help="the histograms' unit (default us)")
    p.add_argument("--ret-sites", action="store_true",
                   help="catch returns with a uprobe on each RET instruction "
                        "(always on Go), not a uretprobe")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the results to FILE, not stdout")
    p.add_argument("--stack-storage-size", type=int, default=DEFAULT_STACK_STORAGE,
                   metavar="N", help="distinct entry stacks the kernel can keep "
                                     f"(default {DEFAULT_STACK_STORAGE})")
    p.set_defaults(backend="bpf")


def _check_frequency(hz: int) -> None:
    """-F within what the kernel takes (else perf_event_open says EINVAL)."""
    if hz <= 0:
        raise UstackError("-F must be a positive frequency")
    from .kernel.perf_event import MAX_SAMPLE_RATE, max_sample_rate
    limit = max_sample_rate()
    if limit is not None and hz > limit:
        raise UstackError(f"-F {hz} is above the kernel's limit of {limit} samples/s "
                          f"({MAX_SAMPLE_RATE}): lower -F, or raise the limit "
                          f"with `sysctl kernel.perf_event_max_sample_rate={hz}`")


def _funccount_options(args, opts) -> None:
    pattern = args.pattern
    if not pattern.startswith(("uprobe:", "u:")):
        pattern = "uprobe:" + pattern
    opts.events = [pattern]
    if args.interval is not None and args.interval <= 0:
        raise UstackError("-i must be a positive number of seconds")
    opts.interval = args.interval


# -- record, report, archive (commands/record.py) ---------------------------------

def _record_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--record", metavar="FILE",
                   help="also save the run to FILE, for `ustack report` later")


def _record_parsers(sub) -> None:
    p = sub.add_parser("record", help="save a run's stacks unsymbolized, for "
                       "`ustack report` later (here or elsewhere)",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="*", metavar="EVENT")
    _unsafe_arg(p)
    p.add_argument("-o", "--output", default=DEFAULT_RECORDING, metavar="FILE",
                   help=f"the recording (default {DEFAULT_RECORDING})")
    p.add_argument("-F", "--frequency", type=int, metavar="HZ",
                   help="also sample on-CPU stacks HZ times a second per CPU "
                        "(the event profile:hz:HZ)")
    _target_args(p)
    _backend_arg(p, "perf", "bpf", "tracefs")
    p.add_argument("--kernel", action="store_true",
                   help="add kernel stacks (bpf)")
    p.add_argument("--stack-storage-size", type=int, default=DEFAULT_STACK_STORAGE,
                   metavar="N", help="distinct stacks the kernel can keep (bpf, "
                                     f"default {DEFAULT_STACK_STORAGE})")
    p.add_argument("--raw-stacks", action="store_true",
                   help="DWARF: save each stack copy (like perf.data, ~100x "
                        "larger) instead of unwinding it while recording")
    p.add_argument("--archive", action="store_true",
                   help="also copy the objects the stacks touch (and their "
                        "debug files) to FILE.objects/, so FILE can be "
                        "reported on another machine")

    p = sub.add_parser("report", help="render a recording in any format",
                       description="Render FILE (made by `ustack record` or "
                       "--record) as the recorded command would have, or "
                       "in another format; FILE.objects/ (record --archive) "
                       "is used when present.")
    p.add_argument("recording", nargs="?", metavar="FILE",
                   help=f"the recording (default {DEFAULT_RECORDING})")
    p.add_argument("-f", "--format", metavar="FORMAT",
                   help=f"counted stacks: {', '.join(FORMATS)}; a stack per "
                        f"event: {', '.join(EVENT_FORMATS)} (default: what the "
                        "recorded command printed)")
    p.add_argument("-o", "--output", metavar="OUT",
                   help="write the report to OUT (its format from its name)")
    p.add_argument("--as", dest="render_as", choices=("count", "trace"),
                   help="count: stacks by frequency, as count/profile print "
                        "them; trace: a stack per event (default: as the "
                        "recorded command did)")
    p.add_argument("--objects", action="append", default=[], metavar="DIR",
                   help="directory holding copies of the recorded binaries, "
                        "found by build-id (repeatable)")
    p.add_argument("--pid", metavar="PID,…", help="only these processes")
    p.add_argument("--tid", metavar="TID,…", help="only these threads")
    p.add_argument("--comm", metavar="NAME,…", help="only threads of these names")
    p.add_argument("-P", "--per-pid", action="store_true",
                   help="count each process separately")
    p.add_argument("--offsets", action="store_true",
                   help="tell call sites apart: frames as func+0xOFF/0xSIZE")
    p.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="a differential flame graph of two recordings")
    _symbol_args(p)

    p = sub.add_parser("archive", help="copy the objects a recording's stacks "
                       "touch, to report it elsewhere (like perf archive)")
    p.add_argument("recording", nargs="?", metavar="FILE",
                   help=f"the recording (default {DEFAULT_RECORDING})")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="where to copy them (default FILE.objects/)")


def _record_options(args, opts) -> None:
    events = list(args.events)
    if args.frequency is not None:
        _check_frequency(args.frequency)
        events.append(f"profile:hz:{args.frequency}")
    if not events:
        raise UstackError("record needs an EVENT or -F HZ (see `ustack record --help`)")
    opts.events = events
    # the kernel counts (bpf): the recording holds counts, as count's run does
    opts.command = "count" if args.backend == "bpf" else "trace"
    opts.record = args.output
    opts.output_path = None              # -o is the recording, not a report
    opts.raw_stacks = args.raw_stacks     # (plan.plan then copies stacks)
    opts.kernel_stacks = args.kernel
    if args.stack_storage_size <= 0:
        raise UstackError("--stack-storage-size must be positive")
    opts.stack_storage = args.stack_storage_size


def _pid_list(text: str) -> tuple:
    """-p 1,2,3 and --tid: decimal ids separated by commas, as perf takes
    them (a leading zero is a decimal digit too: 007 is 7, as for perf)."""
    items = text.split(",")
    for item in items:
        if not item:
            raise argparse.ArgumentTypeError(f"an empty id in {text!r}")
        if not (item.isascii() and item.isdigit()):
            raise argparse.ArgumentTypeError(f"not a decimal id: {item!r} in {text!r}")
    return tuple(dict.fromkeys(int(x) for x in items))


def _id_list(text, what: str) -> frozenset:
    if not text:
        return frozenset()
    try:
        return frozenset(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UstackError(f"--{what} takes numbers separated by commas, "
                          f"not {text!r}") from None


def _run_report(args) -> int:
    from .commands import record as rc
    from .options import Options
    recording = args.recording or DEFAULT_RECORDING
    if args.cmd == "archive":
        return rc.archive_command(recording, args.output)
    request = rc.ReportRequest(
        recording, args.format, args.output, tuple(args.objects),
        rc.SampleFilter(_id_list(args.pid, "pid"), _id_list(args.tid, "tid"),
                        frozenset(c for c in (args.comm or "").split(",") if c)),
        args.per_pid, args.offsets, args.render_as)
    opts = Options(symbols=_symbol_options(args))
    if args.diff:
        if args.recording:
            raise UstackError("--diff takes the two recordings; give no FILE beside it")
        before, after = args.diff
        return rc.report_diff(rc.ReportRequest(after, args.format, args.output,
                                               request.objects, request.only,
                                               args.per_pid, args.offsets),
                              before, opts)
    return rc.report(request, opts)


# subcommand -> what adds its parser (--help lists them in this order)
_SUBCOMMANDS = {
    "trace": _trace_parser, "count": _count_parser, "profile": _profile_parser,
    "offcpu": _offcpu_parser, "symbolize": _symbolize_parser,
    "funccount": _funccount_parser, "latency": _latency_parser,
    "memleak": _memleak_parser, "list": _list_parser, "dump": _dump_parser,
    "record": _record_parsers, "report": _record_parsers, "archive": _record_parsers,
}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    named = argv[0] if argv and argv[0] in _SUBCOMMANDS else None
    try:
        args = build_parser(named).parse_args(argv)
        return _run(args)
    except UstackError as e:
        print(f"ustack: {e}", file=sys.stderr)
        return 130 if isinstance(e, Interrupted) else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def entry() -> None:
    """The `ustack` command (its console script and `python -m ustack`):
    main(), then out at once. Tearing the interpreter down, freeing every
    module and object one by one, took ~15 ms after the report was out;
    the outputs are flushed and the line answers saved first, which is all
    of it that matters."""
    try:
        status = main()
    except SystemExit as e:                 # --help, --version: argparse's exit
        status = e.code if isinstance(e.code, int) else (e.code is not None)
    memos = sys.modules.get("ustack.objfile.line_memo")    # if names were asked
    if memos is not None:
        memos.save_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError):
            pass
    os._exit(status)


if __name__ == "__main__":
    entry()
