"""The captures by backend name and mode (what plan.plan returns): a new
capture is a new module and a line here."""
from __future__ import annotations

from ..defaults import DEFAULT_BUFFER_PAGES, DWARF_BUFFER_PAGES


def new_capture(backend: str, probes: list, target, modes: tuple, opts,
                kernel_tables=None, user_only: bool = False):
    """An unopened capture of `probes` in `target`; `opts` is the run's
    Options (buffer pages, stack size and storage, --kernel, command);
    `kernel_tables`: for DWARF unwinding in the kernel, the unwind rows of
    an object (Plan.kernel_tables); `user_only`: a run without root
    (Plan.user_only), whose events sample user space only."""
    if backend == "bpf" and opts.command == "offcpu":
        from .bpf_offcpu import OffcpuCapture
        return OffcpuCapture(probes, target, opts, kernel_tables)
    if backend == "bpf" and opts.command == "funccount":
        from .bpf_funccount import FuncCountCapture
        return FuncCountCapture(probes, target)
    if backend == "bpf":
        bpf_opts = dict(stack_storage=opts.stack_storage, kernel=opts.kernel_stacks,
                        weighted=getattr(opts, "weight", None) is not None,
                        unwind_memory=opts.unwind_memory, stack_size=opts.stack_size)
        if kernel_tables is None:
            from .bpf_count import StackCountCapture
            return StackCountCapture(probes, target, opts.buffer_pages, **bpf_opts)
        from .bpf_dwarf import UnwindCountCapture, UnwindTraceCapture
        mode = UnwindTraceCapture if opts.runs_as == "trace" else UnwindCountCapture
        return mode(probes, target, opts.buffer_pages, unwind_tables=kernel_tables,
                    python=opts.python, js=opts.js_named, php=opts.php_named,
                    perl=opts.perl_merged, ruby=opts.ruby_named, **bpf_opts)
    if backend == "tracefs":
        from .tracefs import TracefsCapture
        return TracefsCapture(probes, target, opts.buffer_pages, modes, opts.stack_size)
    if backend == "perf":
        from .perf import PerfCapture, lockable_pages
        pages = opts.buffer_pages or (DWARF_BUFFER_PAGES if "dwarf" in modes
                                      else DEFAULT_BUFFER_PAGES)
        if user_only:
            pages = lockable_pages(pages, explicit=opts.buffer_pages is not None)
        return PerfCapture(probes, target, pages, modes, opts.stack_size,
                           user_only=user_only, scripts=(opts.ruby_named, opts.php_named,
                                                         opts.perl_merged))
    raise ValueError(f"no such backend: {backend}")

