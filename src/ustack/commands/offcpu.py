"""`ustack offcpu`: where threads wait. Stacks at the moment a thread left
the CPU, weighted by the time it stayed off it, summed in the kernel
(capture/bpf_offcpu.py); with --wakers, the stack of the thread that woke
it above a `[woken by]` frame, as bcc's offwaketime draws it. Every counted-stack
format shows the weights as time (ReportContext.value_unit)."""
from __future__ import annotations

import sys
from io import TextIOBase

from ..capture.bpf_offcpu import ALL_STATES, OffcpuFilter
from .every import OFFCPU_LABEL
from .run import every_options, run_every, run_session
from ..model import Frame, Stack, StackCount, UstackError
from ..counting.tally import unwound_now
from ..options import Options, check_stack_storage, run_options
from ..report.formats import FORMATS, run_context, stack_report
from ..report.output import choose_format, open_output
from ..symbols.stacks import IDLE, SEPARATOR

SWITCH = "tracepoint:sched:sched_switch"
WAKING = "tracepoint:sched:sched_waking"
EVENT_LABEL = OFFCPU_LABEL
# Between the blocked thread's stack and its waker's (bcc's offwaketime
# writes `--`, which here already parts kernel from user frames)
WAKER_SEPARATOR = Frame(addr=0, module="", function="[woken by]")
# The waker's name when no thread woke it (a timer, a device)
INTERRUPT = "[interrupt]"


def main(args) -> int:
    """`ustack offcpu` from its parsed arguments."""
    opts = run_options(args)
    flt = offcpu_filter(args.min_block, args.max_block, args.state, args.wakers)
    if args.unwind == "fp":
        raise UstackError("offcpu unwinds with DWARF in the kernel; --unwind fp "
                          "is not an option here")
    check_stack_storage(args.stack_storage_size)
    # -T: each thread apart (implies -P), as count and profile split them
    opts.per_pid, opts.per_thread = args.per_pid or args.per_thread, args.per_thread
    opts.offsets = args.offsets
    opts.kernel_stacks, opts.stack_storage = args.kernel, args.stack_storage_size
    every_options(opts, args)
    if opts.every is not None and flt.wakers:
        raise UstackError("--every counts each interval's blocked stacks; the wakers' "
                          "are not kept per interval (drop --wakers)")
    return run_offcpu(offcpu_options(opts, flt))


def offcpu_filter(min_us: float | None, max_us: float | None, states,
                  wakers: bool) -> OffcpuFilter:
    """The checked filter of the command line's --min-block, --max-block
    (microseconds, as bcc's) and --state letters."""
    min_ns = 1000 if min_us is None else int(min_us * 1000)
    max_ns = None if max_us is None else int(max_us * 1000)
    if min_ns < 0:
        raise UstackError("--min-block must be 0 or more microseconds")
    if max_ns is not None and max_ns <= 0:
        raise UstackError("--max-block must be a positive number of microseconds")
    if max_ns is not None and min_ns > max_ns:
        raise UstackError(f"--min-block {min_us:g} is above --max-block {max_us:g}: "
                          "no block could count")
    chosen = []
    for word in states or ALL_STATES:
        for letter in word.replace(",", " ").split():
            if letter not in ALL_STATES:
                raise UstackError(f"unknown --state {letter!r} (one of "
                                  f"{' '.join(ALL_STATES)}: R running/preempted, "
                                  "S sleeping, D uninterruptible, …)")
            chosen.append(letter)
    if not chosen:
        raise UstackError("--state needs at least one state letter")
    return OffcpuFilter(min_ns, max_ns, tuple(dict.fromkeys(chosen)), wakers)


def offcpu_options(opts: Options, flt: OffcpuFilter) -> Options:
    """`opts` (target, output, symbols) made an offcpu run."""
    opts.command = "offcpu"
    opts.events = [SWITCH] + ([WAKING] if flt.wakers else [])
    opts.offcpu = flt
    opts.backend = "bpf"
    return opts


def run_offcpu(opts: Options, err: TextIOBase = sys.stderr) -> int:
    """The command: run until the target exits, -d or Ctrl-C, then the
    report of the blocked stacks in opts' format."""
    if opts.every is not None:           # a pprof file (and/or rows) per interval
        return run_every(opts, err)
    fmt = choose_format(opts.output_format, opts.output_path, FORMATS)

    def body(session, progress) -> int:
        for _piece in session.pieces():
            # stacks the kernel handed over, unwound while their processes
            # live (a JVM's Java frames are read from its memory)
            session.capture.unwind_deferred(lambda s: unwound_now(session, s)[0])
        context = run_context("offcpu", [EVENT_LABEL], start_ns=session.started_ns,
                              value_unit="nanoseconds")
        report = stack_report(fmt, opts.per_pid, opts.offsets, context)
        counted = blocked_stacks(session)
        for sc in counted:
            report.add(sc)
        progress.stop()
        with output as out:
            report.finish(out)
        return len(counted)

    output = open_output(opts.output_path,              # before anything is armed
                         binary=getattr(FORMATS[fmt], "binary", False))
    try:
        return run_session(opts, body, err)[0]
    finally:
        output.discard()


def blocked_stacks(session) -> list:
    """StackCounts of the run's blocked stacks, `count` in nanoseconds;
    with a waker, its stack (outermost first, its thread's name on top)
    then WAKER_SEPARATOR above the blocked one: in folded lines, the
    blocked stack from its root, the separator, the waker's from its leaf
    to its root, then the waker's name."""
    resolver, tracker = session.resolver, session.tracker
    per_thread = session.opts.per_thread
    out = []
    for sample, waker, ns in session.capture.blocked():
        stack = resolver.stack(sample)
        if waker is not None:
            woke = resolver.stack(waker)
            frames = woke.frames
            if waker.pid == 0:                # an interrupt, or the idle task
                name = INTERRUPT
                frames = tuple(f for f in frames if f not in (SEPARATOR, IDLE))
            else:
                name = tracker.comm(waker.pid, waker.tid)
            stack = Stack((Frame(addr=0, module="", function=name),)
                          + tuple(reversed(frames)) + (WAKER_SEPARATOR,)
                          + stack.frames,
                          stack.notes + tuple(f"waker: {n}" for n in woke.notes))
        out.append(StackCount(tracker.comm(sample.pid, sample.tid), sample.pid, stack,
                              ns, EVENT_LABEL, sample.tid if per_thread else 0))
    return out
