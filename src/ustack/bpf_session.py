"""A run that counts in the kernel: `count`/`profile` with the BPF backend,
and `funccount`. It is session.Run with another capture: the same probes,
target, events and mapping tracker; the stacks come from BPF maps at the end
instead of from samples (see capture/bpf.py), and are reported by the same
report stage, so the output is the perf backend's."""
from __future__ import annotations

import time

from .capture import bpf as bpfcap
from .capture.perf import PerfCapture
from .kernel import bpf
from .model import Frame, Sample, Stack, StackCount, UstackError
from .report.funccount import format_calls
from .session import Run
from .symbols.kallsyms import KernelSymbols

# Only tracking records (MMAP2, COMM, FORK) travel through the buffers.
BPF_BUFFER_PAGES = 256
# Printed between the kernel frames and the user frames of a stack (bcc's
# separator); kernel frames come first: a stack reads innermost first.
SEPARATOR = Frame(addr=0, module="", function="--")


class BpfRun(Run):
    backend = "bpf"

    def __init__(self, opts, out, err):
        super().__init__(opts, out, err)
        self.counter = None
        self._next_print = None

    # -- which backend ----------------------------------------------------
    def _perf_reason(self, modes: dict):
        """Why this run must use the perf backend, or None for BPF."""
        opts = self.opts
        if opts.mode == "funccount":
            if not bpf.available():
                raise UstackError("funccount counts in the kernel and BPF is not "
                                  "available here (bpf(2) failed)")
            return None
        if opts.unwind == "dwarf":
            return ("in-kernel counting walks frame pointers only; "
                    "--unwind dwarf uses the perf backend")
        if opts.backend == "auto" and "dwarf" in modes.values() \
                and not opts.kernel_stacks:
            return ""                       # auto: the unwinder decides, quietly
        if not bpf.available():
            if opts.backend == "bpf" or opts.kernel_stacks:
                raise UstackError("BPF is not available here (bpf(2) failed); "
                                  "use --backend perf")
            return ""
        return None

    def _capture_and_loop(self, probes, target, modes: dict, stop) -> int:
        try:
            reason = self._perf_reason(modes)
        except BaseException:
            target.abort()
            raise
        if reason is not None:
            if self.opts.kernel_stacks:
                target.abort()
                raise UstackError("--kernel needs in-kernel counting (the bpf "
                                  "backend), which walks frame pointers only")
            self.backend = "perf"           # Run's own capture and report
            status = super()._capture_and_loop(probes, target, modes, stop)
            if reason:                      # after the header and the report
                print(f"note: {reason}", file=self.err)
            return status
        no_stacks = self.opts.mode == "funccount"
        modes = {label: "none" if no_stacks else "fp" for label in modes}
        try:
            return super()._capture_and_loop(probes, target, modes, stop)
        finally:
            if self.counter is not None:
                self.counter.close()        # after the events (closed above)

    def _open_capture(self, probes, target, modes: dict) -> PerfCapture:
        if self.backend != "bpf":
            return super()._open_capture(probes, target, modes)
        opts = self.opts
        capture = PerfCapture(probes, target, opts.buffer_pages or BPF_BUFFER_PAGES,
                              with_stacks=False)
        try:
            self.counter = bpfcap.BpfCounter(
                probes, stack_storage=opts.stack_storage, kernel=opts.kernel_stacks,
                filter_tgid=target.pid if target.mode != "system" else None,
                calls_only=opts.mode == "funccount")
            capture.open()
            if target.mode == "command":
                self.counter.arm_on_exec(target.pid)
            self.counter.attach(capture)
        except BaseException:
            capture.close()
            target.abort()
            raise
        self.probes = probes
        if opts.interval:
            self._next_print = time.monotonic() + opts.interval
        return capture

    # -- funccount -----------------------------------------------------------
    def _calls_table(self, reset: bool) -> str:
        names = [p.symbol or f"0x{p.address:x}" for p in self.probes]
        totals: dict = {}
        for name, n in zip(names, self.counter.calls(reset)):
            totals[name] = totals.get(name, 0) + n
        return format_calls(totals.items())

    def _on_tick(self) -> None:
        if self._next_print is not None and time.monotonic() >= self._next_print:
            self._next_print += self.opts.interval
            self.out.write(self._calls_table(reset=True) + "\n")
            self.out.flush()

    # -- the report ----------------------------------------------------------
    def _report_counts(self, reader, symbolizer, view) -> None:
        if self.backend != "bpf":
            return super()._report_counts(reader, symbolizer, view)
        if self.opts.mode == "funccount":
            self.out.write(self._calls_table(reset=False))
            return
        counter = self.counter
        ksyms = KernelSymbols() if self.opts.kernel_stacks else None
        view.generation = None              # maps as they are now (see README)
        counted = []
        for c in counter.counted():
            probe = self.probes[c.probe]
            slot = getattr(probe, "return_address_slot", None)
            sample = Sample(probe.label, 0, c.pid, c.tid, -1, counter.stack(c.user_stack),
                            c.entry_word.to_bytes(8, "little") if slot is not None
                            else None, None, 0 if slot is not None else None)
            addrs, _notes = self._addresses(sample, view.find)
            frames = symbolizer.frames(c.pid, addrs)
            if ksyms is not None:
                kernel = tuple(ksyms.frame(a) for a in counter.stack(c.kernel_stack))
                if kernel:
                    frames = kernel + (SEPARATOR,) + frames
            counted.append(StackCount(self.tracker.comm(c.pid, c.tid), c.pid,
                                      Stack(frames), c.count, probe.label))
        self._write_counts(counted)
        self._report_errors()

    def _report_errors(self) -> None:
        collided, stacks_full, counts_full = self.counter.errors_seen()
        if not (collided or stacks_full or counts_full):
            return
        why = []
        if collided:
            why.append(f"{collided} had a stack id collision")
        if stacks_full:
            why.append(f"{stacks_full} found the stack map full")
        if counts_full:
            why.append(f"{counts_full} found the count map full")
        total = collided + stacks_full + counts_full
        print(f"{total} events were not counted ({', '.join(why)}): try "
              f"--stack-storage-size {self.opts.stack_storage * 4}", file=self.err)
