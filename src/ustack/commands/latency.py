"""`ustack latency EVENT…`: how long functions (uprobe:PATH:FUNC) and
syscalls (syscall:NAME) take, from entry to return, as log2 histograms
counted in the kernel (capture/bpf_latency.py), per function or per
function and calling stack (--by-stack); or each call slower than a
threshold with its stack (--slower, bcc's funcslower).

Returns: a uretprobe on C, C++ and Rust; on Go (where a uretprobe crashes
the program), with --ret-sites, and with stacks (a uretprobe's trampoline
replaces return addresses the stacks walk through), a uprobe on each RET instruction of the
function (probes/return_sites.py), the Go entry probe after the stack-growth
check (as every Go entry uprobe, probes/resolve.py), and calls paired per goroutine. A tail call's jmp out of the
function ends its call untimed (said at the end)."""
from __future__ import annotations

import sys
from io import TextIOBase

from .run import _given, run_session
from ..counting.tally import unwound_now
from ..model import TracepointProbe, UprobeProbe, UstackError
from ..objfile.elf import ElfImage
from ..options import Options, run_options
from ..objfile.on_disk import OnDisk
from ..probes.entries import return_probe_refusal
from ..probes.return_sites import entry_site, return_probes
from ..probes.spec import parse_event
from ..report.latency import format_histogram, format_slow_call
from ..output import check_destination
from ..report.formats import format_for_path
from ..report.output import choose_format, open_output
from ..session import Session
from ..values import replace, value

UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000}


@value(frozen=False)
class LatencyRequest:
    """What latency adds to a run's Options."""
    by_stack: bool = False
    slower_ms: float | None = None    # --slower: report calls at least this slow
    units: str = "us"
    ret_sites: bool = False              # returns by RET uprobes also outside Go

    @property
    def unit_ns(self) -> int:
        return UNITS[self.units]

    @property
    def wants_stacks(self) -> bool:
        return self.by_stack or self.slower_ms is not None


def main(args) -> int:
    """`ustack latency` from its parsed arguments."""
    opts = run_options(args)
    opts.events = args.events
    opts.stack_storage = args.stack_storage_size
    return run_latency(opts, LatencyRequest(args.by_stack, args.slower, args.units,
                                            args.ret_sites))


def check_request(opts: Options, request: LatencyRequest) -> None:
    """Refuse what latency cannot do, before anything is attached."""
    if request.units not in UNITS:
        raise UstackError(f"--units must be one of {', '.join(UNITS)}")
    if request.slower_ms is not None and not 0 <= request.slower_ms < float("inf"):
        raise UstackError("--slower takes a duration in milliseconds, 0 or more")
    for text in opts.events:
        spec = parse_event(text)
        if spec.kind not in ("uprobe", "syscall"):
            raise UstackError(f"latency measures functions (uprobe:PATH:FUNC) and "
                              f"syscalls (syscall:NAME), not {spec.kind} events: {text}")
        if spec.args:
            raise UstackError(f"latency takes no fetch-args: {text}")
        if spec.offset:
            raise UstackError(f"latency times whole calls: give the function "
                              f"without +0x{spec.offset:x}: {text}")


def latency_probes(entries: list, ret_sites: bool, notes: list) -> tuple:
    """(the probes to place, what each is to the programs: Site) for the
    resolved entry probes: each function's entry (Go's past its
    stack-growth check, as probes/resolve.py places it) first, then its returns."""
    from ..capture.bpf_latency import Site
    probes, sites = [], []
    returns = []
    skipped = []                     # a glob's matches that are not functions' starts
    for i, entry in enumerate(entries):
        if isinstance(entry, TracepointProbe):
            name = entry.name[len("sys_enter_"):]
            probes.append(entry)
            sites.append(Site(i, "entry"))
            returns.append((TracepointProbe(entry.spec, "syscalls", f"sys_exit_{name}",
                                            f"syscall:{name} (exit)"), Site(i, "return")))
            continue
        image = ElfImage.open(entry.path)
        sym = image.symbols.lookup(entry.address)
        # (a Go function's entry probe comes placed after its stack check)
        if not _at_start(entry, image, sym, ret_sites):
            if _is_glob(entry.spec.function):   # a function's .cold part, say
                skipped.append(entry.symbol or f"0x{entry.address:x}")
                continue
            raise UstackError(f"{entry.label} is not the start of a function")
        refusal = return_probe_refusal(OnDisk.of(entry.path), entry.address, entry.symbol)
        if refusal and not image.file.is_go:    # its return would be timed from [sp]
            if _is_glob(entry.spec.function):
                skipped.append(entry.symbol or f"0x{entry.address:x}")
                continue
            raise UstackError(f"{entry.label} cannot be timed: {refusal}")
        if not (image.file.is_go or ret_sites):
            probes.append(entry)
            sites.append(Site(i, "entry"))
            ret = replace(
                entry, spec=replace(entry.spec, kind="uretprobe"),
                return_address_slot=None,
                label=entry.label.replace("uprobe:", "uretprobe:", 1))
            returns.append((ret, Site(i, "return")))
            continue
        go = image.file.is_go
        probes.append(entry)
        sites.append(Site(i, "entry", goroutine=go))
        rets, tails = return_probes(entry, image)
        returns += [(p, Site(i, "return", goroutine=go)) for p in rets]
        returns += [(p, Site(i, "tail", goroutine=go)) for p in tails]
        if tails:
            notes.append(f"{entry.symbol} leaves through a tail call at "
                         + ", ".join(f"+0x{p.symbol_offset:x}" for p in tails)
                         + ": such calls end there untimed (the callee returns "
                           "for it)")
    for probe, site in returns:
        probes.append(probe)
        sites.append(site)
    if skipped:
        notes.append(f"not timed, not the start of a function: {', '.join(skipped[:5])}"
                     + (f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""))
    if not probes:
        raise UstackError("no function to time: every match is inside one")
    return probes, sites


def _at_start(entry, image, sym, ret_sites: bool) -> bool:
    """Whether `entry` is where its function starts: as the ELF symbols
    say, or (a static function named by debug info only, timed by a
    uretprobe) at offset 0 of a symbol that is no function's .cold part,
    which is jumped to, not called."""
    if sym is not None:
        return entry.symbol is not None and entry.address == entry_site(image, sym)
    return (entry.symbol is not None and not entry.symbol_offset
            and ".cold" not in entry.symbol and not (image.file.is_go or ret_sites))


def readable_label(probe) -> str:
    """A probe's label with a C++/Rust function's name demangled as a user
    types it (`shop::Counter::add`), with its parameters where that name
    is overloaded."""
    from ..objfile.demangle import demangle, is_mangled, plain_name
    symbol = getattr(probe, "symbol", None)
    if not symbol or not is_mangled(symbol):
        return probe.label
    full = demangle(symbol)
    shown = plain_name(full)
    if len(ElfImage.open(probe.path).symbols.overloads(shown)) > 1:
        shown = full
    return probe.label.replace(symbol, shown, 1)


def _is_glob(pattern) -> bool:
    return pattern is not None and any(c in pattern for c in "*?[")


class LatencySession(Session):
    """A Session whose capture is latency's: the resolved probes are the
    functions' entries; their returns are added here."""

    def __init__(self, opts: Options, request: LatencyRequest):
        super().__init__(opts)
        self.request = request
        self.setup_notes: list = []
        self.named: list = []

    def open(self) -> None:
        super().open()
        if self.opts.symbols.demangle:     # the header's and histograms' names
            self.labels = [readable_label(p) for p in self.probes]

    def _open_capture(self):
        from ..capture.bpf_latency import LatencyCapture
        from .. import plan as policy
        request = self.request
        self.plan, why = policy.plan_latency(self.probes, self.opts.unwind,
                                             request.wants_stacks)
        # a uretprobe puts its trampoline in place of the caller's return
        # address: stacks walked through a timed call (nesting, recursion)
        # would end there, so runs that want stacks take returns at RETs
        probes, sites = latency_probes(self.probes,
                                       request.ret_sites or request.wants_stacks,
                                       self.setup_notes)
        # the events named one by one: each gets its line, count 0 included
        self.named = sorted({s.function for s in sites if s.role == "entry"
                             and not _is_glob(self.probes[s.function].spec.text)})
        if why:
            self.setup_notes.append(f"{why}; entry stacks walk frame pointers")
        tables, fp = self.plan.kernel_tables, "fp" in self.plan.modes
        capture = LatencyCapture(
            probes, sites, self.target, self.opts.buffer_pages,
            unit_ns=request.unit_ns, by_stack=request.by_stack,
            slower_ns=(None if request.slower_ms is None
                       else int(request.slower_ms * 1_000_000)),
            unwind_tables=tables, fp_stacks=fp, stack_storage=self.opts.stack_storage,
            unwind_memory=self.opts.unwind_memory,
            python=self.opts.python, js=self.opts.js_named, php=self.opts.php_named,
            perl=self.opts.perl_merged, ruby=self.opts.ruby_named)
        capture.interrupt = self.interrupt
        capture.names = self.names
        capture.open()
        capture.unwind_note = _returns_note(probes, sites, tables is not None)
        return capture


def _returns_note(probes: list, sites: list, stacks: bool) -> str:
    rets = sum(s.role == "return" and isinstance(p, UprobeProbe)
               and p.spec.kind == "uprobe" for p, s in zip(probes, sites))
    kinds = []
    if any(p.spec.kind == "uretprobe" for p in probes if isinstance(p, UprobeProbe)):
        kinds.append("uretprobe")
    if rets:
        kinds.append(f"uprobes on {rets} RET instruction{'s' * (rets != 1)}")
    if any(s.goroutine for s in sites):
        kinds.append("paired per goroutine")
    note = "returns: " + ", ".join(kinds) if kinds else ""
    if stacks:
        note = "entry stacks unwound in the kernel" + ("; " + note if note else "")
    return note


def run_latency(opts: Options, request: LatencyRequest, out: TextIOBase | None = None,
                err: TextIOBase = sys.stderr) -> int:
    check_request(opts, request)
    opts.command = "latency"
    if opts.output_path and opts.output_path != "-":
        check_destination(opts.output_path, f"-o {opts.output_path}")
        # histograms are text: -o lat.html must not get text under that name
        implied = format_for_path(opts.output_path)
        if implied not in (None, "text"):
            raise UstackError(f"-o {opts.output_path}: latency writes text, not {implied}")
        choose_format(None, opts.output_path, {"text": None})
    session = LatencySession(opts, request)
    unit, unit_ns = request.units, request.unit_ns

    def body(session: LatencySession, progress) -> int:
        session.notes.extend(session.setup_notes)
        with output as w:
            w = progress.guard(w)
            for piece in session.pieces():
                # entry stacks the kernel handed over, unwound while their
                # processes live (a JVM's Java frames are read from its memory)
                session.capture.unwind_deferred(lambda s: unwound_now(session, s)[0])
                for s in piece.samples:        # --slower: a slow call
                    w.write(format_slow_call(
                        session.tracker.comm(s.pid, s.tid), s.pid, s.tid, s.cpu, s.time_ns,
                        session.labels[s.probe], s.args[0][2], unit, unit_ns,
                        session.resolver.stack(s)))
                if piece.samples:
                    w.flush()
            hists = session.capture.histograms()
            calls = sum(h.count for h in hists)
            for i, n in enumerate(session.capture.tail_exits()):
                if n:
                    session.notes.append(f"{n} calls of {session.labels[i]} left "
                                         "through a tail call and were not timed")
            running = session.capture.in_flight()
            if running:
                session.notes.append(f"{running} calls had not returned when the run "
                                     "ended (not timed)")
            if request.slower_ms is None:
                w.write(_histograms(session, hists, unit, unit_ns))
        return calls

    # opened before anything is armed; --slower's lines appear with the file
    output = _given(out) if out is not None else open_output(opts.output_path)
    try:
        return run_session(opts, body, err, session)[0]
    finally:
        output.discard()


def _histograms(session: LatencySession, hists: list, unit: str, unit_ns: int) -> str:
    """The histograms in the order of the events, each function's by count;
    by stack, those whose stacks print the same (call sites within one
    function differ only by offset) merged into one."""
    from ..model import RawSample
    from ..report.counts import function_label
    merged: dict = {}                    # (function, printed stack) -> [Histogram, Stack]
    for h in hists:
        stack = None
        if session.request.by_stack:
            stack = session.resolver.stack(h.sample or RawSample(
                h.function, h.pid, h.pid, 0, -1, h.chain, h.return_address))
        key = (h.function, stack and (tuple(map(function_label, stack.frames)),
                                      stack.notes))
        if key not in merged:
            merged[key] = [h, stack]
            continue
        m = merged[key][0]
        merged[key][0] = replace(
            m, count=m.count + h.count, total_ns=m.total_ns + h.total_ns,
            min_ns=min(m.min_ns, h.min_ns), max_ns=max(m.max_ns, h.max_ns),
            buckets=[a + b for a, b in zip(m.buckets, h.buckets)])
    text = []
    seen = {h.function for h, _stack in merged.values()}
    never = [(i, format_histogram(session.labels[i], 0, 0, 0, 0, [], unit, unit_ns))
             for i in session.named if i not in seen]      # not called: count 0
    for h, stack in sorted(merged.values(), key=lambda hs: (hs[0].function, hs[0].count)):
        text.append((h.function, format_histogram(
            session.labels[h.function], h.count, h.total_ns, h.min_ns, h.max_ns,
            h.buckets, unit, unit_ns, stack)))
    return "".join(t for _i, t in sorted(text + never, key=lambda it: it[0]))
