"""`ustack memleak -p PID | -c CMD`: allocations not freed, by stack (bcc's
memleak): libc's allocators and frees probed in the libc the target maps,
the outstanding blocks and their per-stack sums kept in the kernel
(capture/bpf_memleak.py), each allocation's stack unwound there with DWARF.
Printed every -i seconds and at the end, largest first; every counted-stack
format with bytes as the weight (ReportContext.value_unit)."""
from __future__ import annotations

import os
import sys
import time
from io import TextIOBase

from .run import _given, run_session
from ..counting.tally import unwound_now
from ..model import StackCount, UstackError
from ..objfile.elf import ElfImage
from ..options import Options, check_stack_storage, run_options
from ..output import check_destination
from ..report.formats import FORMATS, run_context, stack_report
from ..report.output import choose_format, open_output
from ..session import Session
from ..values import replace, value

# libc's allocators, each with its kind of arguments (enum memleak_kind)
ALLOCATORS = (("malloc", "ML_MALLOC"), ("calloc", "ML_CALLOC"), ("realloc", "ML_REALLOC"),
              ("posix_memalign", "ML_POSIX_MEMALIGN"), ("aligned_alloc", "ML_ALIGNED"),
              ("memalign", "ML_ALIGNED"), ("valloc", "ML_MALLOC"),
              ("pvalloc", "ML_MALLOC"), ("mmap", "ML_MMAP"))
FREES = ("free", "munmap")
EVENT_LABEL = "memleak"


@value(frozen=False)
class MemleakRequest:
    """What memleak adds to a run's Options."""
    interval: float | None = None     # -i: print every SECONDS too
    top: int = 10                     # --top: stacks printed (text)
    older_ms: float | None = None     # --older: only blocks at least this old


@value
class Function:
    """One probed libc function: its name, its role (entry | free) and,
    for an allocator, its kind."""
    name: str
    role: str
    kind: str = ""
    # every allocator at this address (glibc's memalign is aligned_alloc):
    # one probe cannot tell which of them was called
    aliases: tuple = ()


def main(args) -> int:
    """`ustack memleak` from its parsed arguments."""
    opts = run_options(args)
    check_stack_storage(args.stack_storage_size)
    opts.stack_storage = args.stack_storage_size
    return run_memleak(opts, MemleakRequest(args.interval, args.top, args.older))


def check_request(opts: Options, request: MemleakRequest, fmt: str) -> None:
    if opts.pids:
        raise UstackError("memleak traces one process: give one -p PID")
    if opts.pid is None and opts.cmdline is None:
        raise UstackError("memleak traces one process: give -p PID or -c CMD")
    if opts.cmdline is not None and not opts.cmdline.strip():
        raise UstackError("-c needs a command")
    if opts.unwind == "fp":
        raise UstackError("memleak unwinds with DWARF in the kernel; --unwind fp is "
                          "not an option here")
    if opts.tids or opts.comms:
        raise UstackError("memleak counts per process: --tid and --comm are not "
                          "options here")
    if request.interval is not None and not 0 < request.interval < float("inf"):
        raise UstackError("-i must be a positive number of seconds")
    if request.interval is not None and fmt != "text":
        raise UstackError(f"-i prints text reports as the run goes; {fmt} is "
                          "written once, at the end")
    if request.top <= 0:
        raise UstackError("--top must be a positive number of stacks")
    if request.older_ms is not None and not 0 <= request.older_ms < float("inf"):
        raise UstackError("--older takes an age in milliseconds, 0 or more")


def target_libc(opts: Options) -> tuple:
    """(host path of the libc the target maps or will map, the path to
    name in probes: `libc` for -p, resolved in that process)."""
    from ..objfile import needed
    from ..probes.binaries import locate_binary
    from ..target import process
    if opts.pid is not None:
        try:
            return locate_binary("libc", opts.pid)[0], "libc"
        except UstackError:
            if not os.path.isdir(f"/proc/{opts.pid}"):
                raise
            raise UstackError(f"process {opts.pid} does not map libc: memleak traces "
                              "libc's allocator") from None
    exe = process.command_executable(opts.cmdline)
    if exe is None:
        raise UstackError(f"no such command: {opts.cmdline.split()[0]}")
    for path in needed.load_closure(exe):
        name = os.path.basename(path)
        if name == "libc.so" or name.startswith("libc.so."):
            return path, path
    raise UstackError(f"{exe} does not load libc (a static program?): memleak "
                      "traces libc's allocator")


def libc_functions(path: str) -> list:
    """The allocators and frees `path` defines, each address once (an
    alias, as memalign and aligned_alloc in glibc, is probed once)."""
    image = ElfImage.open(path)
    at: dict = {}                        # address -> the names found there
    for name, role, kind in ([(n, "entry", k) for n, k in ALLOCATORS]
                             + [(n, "free", "") for n in FREES]):
        syms = [s for s in image.find(name) if s.size]
        if syms:
            at.setdefault(syms[0].address, []).append((name, role, kind))
    out = [Function(*found[0], aliases=tuple(n for n, _r, _k in found)
                    if len(found) > 1 else ())
           for found in at.values()]
    if not any(f.name == "malloc" for f in out) or not any(f.name == "free" for f in out):
        raise UstackError(f"{path} defines no malloc and free to probe")
    return out


class MemleakSession(Session):
    """A Session whose capture is memleak's: the resolved probes are the
    functions' entries (opts.events, in `functions`' order); the
    allocators' returns are added here."""

    def __init__(self, opts: Options, functions: list, libc: str):
        super().__init__(opts)
        self.functions = functions
        self.libc = libc

    def open(self) -> None:
        super().open()
        self.labels = [f"allocations in {self.libc}"]    # the header's words

    def _open_capture(self):
        from ..capture import bpf_unwind
        from ..capture.bpf_memleak import MemleakCapture, Site
        from ..kernel import bpf_syscall
        from ..unwind import tables
        from .. import plan as policy
        if not bpf_syscall.available():
            raise UstackError("memleak keeps its tables in the kernel and BPF is not "
                              "available here (bpf(2) failed)")
        why = bpf_unwind.why_unavailable(self.probes)
        if why is not None:
            raise UstackError(f"memleak unwinds in the kernel, whose unwinder did "
                              f"not load: {why}")
        probes, sites, returns = [], [], []
        for probe, f in zip(self.probes, self.functions, strict=True):
            probes.append(probe)
            sites.append(Site(f.role, f.kind))
            if f.role == "entry":      # libc is not Go: a uretprobe is safe
                returns.append(replace(
                    probe, spec=replace(probe.spec, kind="uretprobe"),
                    return_address_slot=None,
                    label=probe.label.replace("uprobe:", "uretprobe:", 1)))
        probes += returns
        sites += [Site("return")] * len(returns)
        self.plan = policy.Plan("bpf", ("dwarf",) * len(self.probes),
                                kernel_tables=tables.for_image)
        capture = MemleakCapture(probes, sites, self.target, self.opts.buffer_pages,
                                 unwind_tables=tables.for_image,
                                 stack_storage=self.opts.stack_storage,
                                 python=self.opts.python, js=self.opts.js_named,
                                 unwind_memory=self.opts.unwind_memory,
                                 php=self.opts.php_named, perl=self.opts.perl_merged,
                                 ruby=self.opts.ruby_named)
        capture.interrupt = self.interrupt
        capture.names = self.names
        capture.open()
        return capture


def run_memleak(opts: Options, request: MemleakRequest, out: TextIOBase | None = None,
                err: TextIOBase = sys.stderr) -> int:
    fmt = choose_format(opts.output_format, opts.output_path, FORMATS)
    check_request(opts, request, fmt)
    if opts.output_path and opts.output_path != "-":
        check_destination(opts.output_path, f"-o {opts.output_path}")
    libc, where = target_libc(opts)
    functions = libc_functions(libc)
    opts.command = "memleak"
    opts.backend = "bpf"
    opts.events = [f"uprobe:{where}:{f.name}" for f in functions]
    session = MemleakSession(opts, functions, libc)
    older_ns = None if request.older_ms is None else int(request.older_ms * 1_000_000)

    def body(session: MemleakSession, progress) -> int:
        with output as w:
            if fmt == "text":
                w = progress.guard(w)
            interval = request.interval
            next_print = time.monotonic() + interval if interval else None
            for _piece in session.pieces():
                # stacks the kernel handed over, unwound while their
                # processes live (a JVM's Java frames are read from its memory)
                session.capture.unwind_deferred(lambda s: unwound_now(session, s)[0])
                if next_print is not None and time.monotonic() >= next_print:
                    next_print += interval
                    w.write(format_outstanding(outstanding(session, older_ns), request.top)
                            + "\n")
                    w.flush()
            counted = outstanding(session, older_ns)
            in_calls = session.capture.counter.in_calls()
            if in_calls:
                session.notes.append(f"{in_calls} allocator calls had not returned when "
                                     "the run ended (not counted)")
            progress.stop()
            if fmt == "text":
                w.write(format_outstanding(counted, request.top))
            else:
                context = run_context("memleak", [EVENT_LABEL], start_ns=session.started_ns,
                                      value_unit="bytes")
                report = stack_report(fmt, context=context)
                for sc, _blocks in counted:
                    report.add(sc)
                report.finish(w)
        return None         # (not a count of events: every block may have been freed)

    binary = getattr(FORMATS[fmt], "binary", False)
    output = _given(out) if out is not None else open_output(   # before anything is armed
        opts.output_path, binary=binary)
    try:
        return run_session(opts, body, err, session)[0]
    finally:
        output.discard()


def outstanding(session: MemleakSession, older_ns: int | None) -> list:
    """(StackCount whose count is bytes, blocks) per process and printed
    stack, largest first: stacks that print the same (call sites within
    one function differ only by offset) merged."""
    from ..report.counts import function_label
    merged: dict = {}
    comm = session.tracker.comm
    shared = {name: "|".join(f.aliases) for f in session.functions for name in f.aliases}
    for sample, nbytes, blocks in session.capture.outstanding(older_ns):
        stack = _allocator_named(session.resolver.stack(sample), shared)
        key = (sample.pid, tuple(map(function_label, stack.frames)), stack.notes)
        if key in merged:
            sc, n = merged[key]
            merged[key] = (replace(sc, count=sc.count + nbytes), n + blocks)
        else:
            merged[key] = (StackCount(comm(sample.pid, sample.pid), sample.pid, stack,
                                      nbytes, EVENT_LABEL), blocks)
    return sorted(merged.values(), key=lambda c: (-c[0].count, -c[1]))


def _allocator_named(stack, shared: dict):
    """The stack with its allocator frame named by every allocator at that
    address (`aligned_alloc|memalign`): the symbol table's pick of one
    alias would name a memalign call aligned_alloc."""
    frames = stack.frames
    if frames and frames[0].function in shared:
        first = replace(frames[0], function=shared[frames[0].function])
        return replace(stack, frames=(first,) + tuple(frames[1:]))
    return stack


def format_outstanding(counted: list, top: int) -> str:
    """bcc memleak's report: the `top` stacks holding the most bytes."""
    from ..report.counts import function_label
    pids = {sc.pid for sc, _n in counted}
    lines = [f"[{time.strftime('%H:%M:%S')}] Top {top} stacks with outstanding "
             "allocations:"]
    for sc, blocks in counted[:top]:
        who = f" in {sc.comm} (PID {sc.pid})" if len(pids) > 1 else ""
        lines.append(f"\t{sc.count} bytes in {blocks} allocation"
                     f"{'s' * (blocks != 1)} from stack{who}")
        lines.extend(f"\t\t{function_label(f)}" for f in sc.stack.frames)
        lines.extend(f"\t\t({note})" for note in sc.stack.notes)
    return "\n".join(lines) + "\n"
