"""Each subcommand's arguments: the argument groups they share and one
builder per subcommand (cli.COMMANDS names them). Light to import: the
commands themselves are imported only to run."""
from __future__ import annotations

import argparse

from ..defaults import (DEFAULT_BUFFER_PAGES, DEFAULT_PROFILE_HZ, DEFAULT_RECORDING, DEFAULT_STACK_SIZE,
                        DEFAULT_STACK_STORAGE, DWARF_BUFFER_PAGES, MAX_STACK_SIZE)
from ..report.formats import EVENT_FORMATS, EXTENSIONS, FORMATS

EVENT_HELP = ("syscall:write  syscall:*  uprobe:PATH:FUNC[+OFF]  uprobe:PATH:0xADDR  "
              "uretprobe:PATH:FUNC  usdt:PATH:[PROVIDER:]NAME  tracepoint:GROUP:NAME  "
              "profile:hz:N")


def target_args(p: argparse.ArgumentParser) -> None:
    who = p.add_mutually_exclusive_group()
    who.add_argument("-p", "--pid", type=pid_list, metavar="PID[,PID…]",
                     help="trace this process (all its threads); several: "
                          "their events among all processes' (decimal, as perf "
                          "takes them: 007 is 7)")
    who.add_argument("-c", "--command", metavar="CMD",
                     help="start CMD and trace it (and its children) until it exits")
    p.add_argument("--tid", type=pid_list, metavar="TID[,TID…]",
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
    p.add_argument("--no-js", action="store_true",
                   help="show node's JS frames as the JIT code and V8 builtins "
                        "they ran (default: their JS functions, named from the "
                        "process's heap where the kernel walks the stack)")
    p.add_argument("--no-java", action="store_true",
                   help="show a JVM's Java frames as the JIT and interpreter code "
                        "they ran (default: their Java methods, walked and named "
                        "from the JVM's own vmStructs tables, on copied stacks)")
    p.add_argument("--no-php", action="store_true",
                   help="show a PHP process's executor as C frames only "
                        "(default: its PHP functions' frames, name, file and line, "
                        "where execute_ex ran them; PHP 8.2 NTS, --backend bpf)")
    p.add_argument("--no-python", action="store_true",
                   help="show a Python process's interpreter as C frames only "
                        "(default: its Python functions' frames, name and line, "
                        "where the interpreter ran them; CPython 3.8-3.13, "
                        "--backend bpf)")
    p.add_argument("--no-perl", action="store_true",
                   help="show a Perl process's interpreter as C frames only "
                        "(default: its Perl subs' frames, package, file and line, "
                        "where its run loop ran them; perl 5.36, --backend bpf)")
    p.add_argument("--no-ruby", action="store_true",
                   help="show a Ruby process's VM calls as C frames only "
                        "(default: its Ruby methods' and blocks' frames, name, "
                        "file and line, where the VM ran them; CRuby 3.1, "
                        "--backend bpf)")
    p.add_argument("--stack-size", type=int, default=DEFAULT_STACK_SIZE, metavar="BYTES",
                   help="user stack bytes copied per event for DWARF unwinding "
                        f"(default {DEFAULT_STACK_SIZE}, at most {MAX_STACK_SIZE})")
    p.add_argument("--unwind-memory", type=float, metavar="MIB",
                   help="bpf: MiB of kernel memory the objects' unwind rows may take, "
                        "made in chunks as they are loaded (default: sized by what the "
                        "targets map, 16 to 256 MiB); "
                        "a stack through an object whose rows do not fit is "
                        "unwound from a copy in user space")
    symbol_args(p)


_BACKEND_HELP = {
    "auto": "auto (default): bpf where it works, else perf",
    "perf": "perf: perf events, stacks walked by the kernel (fp) or copied out "
            "(dwarf)",
    "bpf": "bpf: stacks unwound and counted in the kernel",
    "tracefs": "tracefs: ftrace alone, in a private instance (no perf events "
               "or BPF needed)",
}


def unsafe_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--unsafe-address", action="store_true",
                   help="also place uprobes at addresses ustack cannot prove to "
                        "be instruction starts (no symbol or CFI before them); "
                        "one inside an instruction corrupts the target")


def backend_arg(p: argparse.ArgumentParser, *choices: str) -> None:
    p.add_argument("--backend", choices=("auto",) + choices, default="auto",
                   help="; ".join(_BACKEND_HELP[c] for c in ("auto",) + choices))
    if "tracefs" in choices:
        p.add_argument("-a", "--every-process", action="store_true",
                       help="tracefs: allow a uprobe glob over a library with -p/-c "
                            "(tracefs uprobes fire in every process that maps the "
                            "file, not only in the target)")


def symbol_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lines", action="store_true",
                   help="add the source file:line of each frame")
    p.add_argument("--inlines", action="store_true",
                   help="show inlined calls as frames of their own (marked inlined)")
    p.add_argument("--no-demangle", action="store_true",
                   help="print C++ and Rust names as they are in the binary")
    p.add_argument("--debug-dir", action="append", default=[], metavar="DIR",
                   help="also look for separate debug files in DIR (repeatable)")
    p.add_argument("--debuginfod", action="append", default=[], metavar="URL",
                   help="ask this debuginfod server for the debug files of objects "
                        "without names (repeatable; default: DEBUGINFOD_URLS)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="say at the end what named each object's frames (.symtab, "
                        ".dynsym, a debug file and how it was found, debuginfod, "
                        "MiniDebugInfo, FDE starts)")


def output_args(p: argparse.ArgumentParser, table: dict) -> None:
    endings = ", ".join(f"{e} {n}" for e, n in EXTENSIONS.items() if n in table)
    p.add_argument("-f", "--format", choices=tuple(table), metavar="FORMAT",
                   help=f"one of {', '.join(table)} (default: from -o's file name "
                        f"({endings}), else text)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the results to FILE, not stdout (a traced "
                        "command's own output stays on the terminal)")


def count_args(p: argparse.ArgumentParser) -> None:
    output_args(p, FORMATS)
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


def add_trace(sub) -> None:
    p = sub.add_parser("trace", help="print a stack for every event",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="+", metavar="EVENT")
    unsafe_arg(p)
    target_args(p)
    backend_arg(p, "perf", "bpf", "tracefs")
    output_args(p, EVENT_FORMATS)


def add_count(sub) -> None:
    p = sub.add_parser("count", help="count stacks by frequency",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="+", metavar="EVENT")
    unsafe_arg(p)
    target_args(p)
    backend_arg(p, "perf", "bpf", "tracefs")
    count_args(p)
    p.add_argument("--weight", metavar="EXPR",
                   help="sum EXPR per stack instead of counting hits (bpftrace's "
                        "sum(arg0)): a parameter name, argN, a fetch-arg "
                        "('+8(%%di):u32'), retval at a uretprobe, a syscall's "
                        "argument by name (count of syscall:write)")
    record_arg(p)
    p.add_argument("--every", type=seconds, metavar="SECONDS",
                   help="count interval by interval: a pprof file per SECONDS into "
                        "-o DIR/ and/or each interval to --to, until Ctrl-C or -d")
    sink_args(p)


def add_profile(sub) -> None:
    p = sub.add_parser("profile", help="sample on-CPU stacks at a frequency")
    p.add_argument("-F", "--frequency", type=int, default=DEFAULT_PROFILE_HZ, metavar="HZ",
                   help=f"samples per second per CPU (default {DEFAULT_PROFILE_HZ})")
    target_args(p)
    backend_arg(p, "perf", "bpf")
    count_args(p)
    record_arg(p)
    p.add_argument("--every", type=seconds, metavar="SECONDS",
                   help="continuous profiling: a pprof file per SECONDS (30 or 30s) "
                        "into the directory -o DIR/ names, until Ctrl-C or -d")
    sink_args(p)


def sink_args(p) -> None:
    """--every's destination besides (or instead of) -o DIR/."""
    p.add_argument("--to", metavar="clickhouse[s]://HOST:PORT/DB",
                   help="--every: send each interval to ClickHouse (HTTP port, or "
                        "HTTPS with clickhouses://; user "
                        "and password from USTACK_CLICKHOUSE_USER/_PASSWORD or the "
                        "file USTACK_CLICKHOUSE_CREDENTIALS names)")
    p.add_argument("--ca", metavar="FILE",
                   help="--to clickhouses://: the CA certificate (PEM) the server's is "
                        "checked against (default: the system's)")
    p.add_argument("--host-label", metavar="NAME",
                   help="--every: this machine's name in the rows and files (default "
                        "$USTACK_HOST_LABEL, else the hostname)")
    p.add_argument("--queue", metavar="DIR",
                   help="--to: where intervals wait while the server is away "
                        "(default ~/.cache/ustack/clickhouse/LABEL)")
    p.add_argument("--queue-size", type=float, default=64, metavar="MiB",
                   help="--to: the queue's bound; past it the oldest intervals "
                        "are dropped, and counted (default 64)")


def seconds(text: str) -> float:
    """30, 30s, 0.5: seconds (argparse says which option when this fails)."""
    return float(text[:-1] if text.endswith("s") else text)


def add_top(sub) -> None:
    p = sub.add_parser("top", help="the hottest functions of a profile, live "
                       "(perf top, py-spy top)",
                       description="Sample on-CPU stacks and show the functions "
                       "with the most samples of their own (self) and under them "
                       "(total), a row per function of each process, refreshed "
                       "every second; keys s, t, f, p sort by self, total, function, "
                       "pid (top's P, T, N too); q or Ctrl-C ends it. "
                       "When stdout is not a terminal, a plain snapshot is "
                       "printed every second instead.")
    p.add_argument("-F", "--frequency", type=int, default=99, metavar="HZ",
                   help="samples per second per CPU (default 99)")
    from ..report.top import SORTS      # top's alone: built only for `ustack top`
    p.add_argument("--sort", choices=SORTS, default="self",
                   help="rank by self samples (default), total samples, function "
                        "name or pid")
    p.add_argument("-n", "--rows", type=int, metavar="N",
                   help="show at most N functions (default: as many as the "
                        "terminal has rows; 20 when not a terminal)")
    target_args(p)
    backend_arg(p, "perf", "bpf")
    p.set_defaults(output=None)


def add_symbolize(sub) -> None:
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
    symbol_args(p)


def add_funccount(sub) -> None:
    p = sub.add_parser("funccount", help="count calls of functions, in the kernel",
                       description="PATTERN: PATH:GLOB (bcc funccount), e.g. "
                                   "'libc:mem*' or '/bin/prog:do_*'")
    p.add_argument("pattern", metavar="PATH:GLOB")
    unsafe_arg(p)
    p.add_argument("-i", "--interval", type=float, metavar="SECONDS",
                   help="print and reset the counts every SECONDS")
    target_args(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the counts to FILE, not stdout")
    p.set_defaults(backend="bpf")         # counts in the kernel, nothing else


def add_list(sub) -> None:
    p = sub.add_parser("list", help="list traceable functions of a binary")
    p.add_argument("binary")
    p.add_argument("pattern", nargs="?", help="glob, e.g. 'mem*'")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="each function's parameters and types (DWARF), as bpftrace -lv")


def add_dump(sub) -> None:
    p = sub.add_parser("dump", help="every thread's stack once, native and Python "
                       "(pstack, py-spy dump)",
                       description="Stop each thread of PID for a moment (ptrace), "
                       "read its registers and stack, let it go on, then print its "
                       "frames innermost first.")
    p.add_argument("-p", "--pid", type=int, required=True, help="the process")
    p.add_argument("-f", "--format", choices=("text", "json"),
                   help="text or json (default: json for a -o file ending .json, else text)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    symbol_args(p)


def add_offcpu(sub) -> None:
    p = sub.add_parser("offcpu", help="stacks where threads block, weighted by the "
                       "time off the CPU (bcc offcputime/offwaketime)",
                       description="Stacks at the moment a thread left the CPU, "
                       "weighted by how long it stayed off it, summed in the kernel "
                       "(sched:sched_switch; DWARF unwinding in the kernel).")
    target_args(p)
    count_args(p)
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
    p.add_argument("--every", type=seconds, metavar="SECONDS",
                   help="continuous: the time off the CPU interval by interval, a "
                        "pprof file per SECONDS into -o DIR/ and/or each interval to "
                        "--to, until Ctrl-C or -d")
    sink_args(p)
    p.set_defaults(backend="bpf")         # sums in the kernel, nothing else


def add_memleak(sub) -> None:
    p = sub.add_parser("memleak", help="allocations not freed, by stack (bcc memleak)",
                       description="libc's allocators and frees probed in the target, "
                       "the blocks not freed and their bytes per stack kept in the "
                       "kernel (DWARF unwinding in the kernel); largest first.")
    target_args(p)
    output_args(p, FORMATS)
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


def add_latency(sub) -> None:
    p = sub.add_parser("latency", help="histograms of the time from entry to "
                       "return of functions and syscalls, counted in the kernel",
                       description="EVENT: uprobe:PATH:FUNC (a glob: one histogram "
                       "per function) or syscall:NAME")
    p.add_argument("events", nargs="+", metavar="EVENT")
    unsafe_arg(p)
    target_args(p)
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


def record_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--record", metavar="FILE",
                   help="also save the run to FILE, for `ustack report` later")


def add_record(sub) -> None:
    p = sub.add_parser("record", help="save a run's stacks unsymbolized, for "
                       "`ustack report` later (here or elsewhere)",
                       description=f"EVENT: {EVENT_HELP}")
    p.add_argument("events", nargs="*", metavar="EVENT")
    unsafe_arg(p)
    p.add_argument("-o", "--output", default=DEFAULT_RECORDING, metavar="FILE",
                   help=f"the recording (default {DEFAULT_RECORDING})")
    p.add_argument("-F", "--frequency", type=int, metavar="HZ",
                   help="also sample on-CPU stacks HZ times a second per CPU "
                        "(the event profile:hz:HZ); with no EVENT, as profile "
                        f"does: {DEFAULT_PROFILE_HZ} Hz unless -F says")
    target_args(p)
    backend_arg(p, "perf", "bpf", "tracefs")
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


def add_report(sub) -> None:
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
                   help="a differential flame graph of two recordings, "
                        "written as HTML only (-o FILE.html, or stdout); with "
                        "--from: two time ranges (START..END) or two hosts "
                        "(host=NAME)")
    p.add_argument("--from", dest="source", metavar="clickhouse[s]://HOST:PORT/DB | DIR/",
                   help="read the intervals `--every --to` sent, or the pprof files "
                        "`--every -o DIR/` wrote, instead of FILE")
    p.add_argument("--ca", metavar="FILE",
                   help="--from clickhouses://: the CA certificate (PEM) the server's "
                        "is checked against (default: the system's)")
    p.add_argument("--host", metavar="NAME,…", help="--from: only these hosts")
    p.add_argument("--container", metavar="ID,…",
                   help="--from: only these containers (their ids, or the ids' first "
                        "characters, as docker ps shows 12)")
    p.add_argument("--since", metavar="TIME", help="--from: intervals from TIME "
                   "(2026-11-28T10:00:00 UTC, or seconds since the epoch)")
    p.add_argument("--until", metavar="TIME", help="--from: intervals before TIME")
    p.add_argument("--event", metavar="EVENT", help="--from: only this event's stacks")
    p.add_argument("--diff-lines", action="store_true",
                   help="--diff: Python frames apart by line (default: by "
                        "function, so lines moved in a new version compare)")
    symbol_args(p)


def add_archive(sub) -> None:
    p = sub.add_parser("archive", help="copy the objects a recording's stacks "
                       "touch, to report it elsewhere (like perf archive)")
    p.add_argument("recording", nargs="?", metavar="FILE",
                   help=f"the recording (default {DEFAULT_RECORDING})")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="where to copy them (default FILE.objects/)")


def pid_list(text: str) -> tuple:
    """-p 1,2,3 and --tid: decimal ids separated by commas, as perf takes
    them (a leading zero is a decimal digit too: 007 is 7, as for perf)."""
    items = text.split(",")
    for item in items:
        if not item:
            raise argparse.ArgumentTypeError(f"an empty id in {text!r}")
        if not (item.isascii() and item.isdigit()):
            raise argparse.ArgumentTypeError(f"not a decimal id: {item!r} in {text!r}")
    return tuple(dict.fromkeys(int(x) for x in items))
