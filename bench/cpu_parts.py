#!/usr/bin/env python3
"""Where one ustack run's CPU goes, measured inside the run: the CPU time
(user + system) of the thread that does each part, summed over the
outermost calls, and the process's total at its exit.

    sudo .venv/bin/python bench/cpu_parts.py trace syscall:write -c 'echo hello'
    sudo .venv/bin/python bench/cpu_parts.py profile -F 99 -p PID -d 2

Parts: the interpreter until this script's first line; imports; each BPF
program's load (the verifier), by name; BTF loads; BPF maps made; unwind
rows loaded; ELF images opened; symbolization; the report written; the
closing summary; the rest. The wrapping adds its own cost
(a few ms): compare parts, not totals, with bench/start_up.py's. The
repository's src/ comes first on the path."""
from __future__ import annotations

import builtins
import importlib
import os
import resource
import sys
import threading
from pathlib import Path

AT_START = resource.getrusage(resource.RUSAGE_SELF)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

spent: dict = {}
_inside = threading.local()


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def measured(part, fn):
    """fn, its CPU added to `part` (a name, or a function of fn's arguments
    that names it), only where no measured call is under way in this
    thread: a part's own calls are not counted twice."""
    def call(*args, **kwargs):
        if getattr(_inside, "busy", False):
            return fn(*args, **kwargs)
        _inside.busy = True
        start = _thread_cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            name = part if isinstance(part, str) else part(*args, **kwargs)
            spent[name] = spent.get(name, 0.0) + _thread_cpu() - start
            _inside.busy = False
    return call


def report() -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    print(f"process: {total * 1000:.1f} ms (user {usage.ru_utime * 1000:.1f}, system "
          f"{usage.ru_stime * 1000:.1f}); the interpreter until this script: "
          f"{(AT_START.ru_utime + AT_START.ru_stime) * 1000:.1f} ms", file=sys.stderr)
    for part, cpu in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {part}: {cpu * 1000:.1f} ms", file=sys.stderr)
    rest = total - sum(spent.values()) - AT_START.ru_utime - AT_START.ru_stime
    print(f"  the rest (set-up's Python, the stream read, exit): {rest * 1000:.1f} ms",
          file=sys.stderr)


def main() -> None:
    builtins.__import__ = measured("imports", builtins.__import__)
    importlib.import_module = measured("imports", importlib.import_module)
    from ustack.kernel import bpf_object, bpf_syscall
    # each program by its name: the verifier's time is most of a load's
    bpf_syscall.load_with_btf = measured(
        lambda _type, code, name, *rest, **kw: f"BPF program load {name} "
                                               f"({len(code) // 8} insns)",
        bpf_syscall.load_with_btf)
    bpf_object.BpfObject._btf = measured("BTF loads", bpf_object.BpfObject._btf)
    bpf_syscall.Map.__init__ = measured("BPF maps made", bpf_syscall.Map.__init__)
    from ustack.capture import unwind_objects
    unwind_objects.UnwindObjects.add_path = measured("unwind rows",
                                                     unwind_objects.UnwindObjects.add_path)
    from ustack.objfile import elf
    elf.ElfImage.open = classmethod(measured("ELF images opened", elf.ElfImage.open.__func__))
    from ustack.symbols import symbolizer
    symbolizer.Symbolizer.frames = measured("symbolization", symbolizer.Symbolizer.frames)
    from ustack.commands import run as run_command
    from ustack.report import formats
    run_command.write_summary = measured("the closing summary", run_command.write_summary)
    reports = formats.stack_report

    def stack_report(*args, **kwargs):          # the report's output, written at its end
        report = reports(*args, **kwargs)
        report.finish = measured("the report written", report.finish)
        return report
    run_command.stack_report = stack_report
    leave = os._exit

    def exit_reporting(code: int) -> None:     # ustack leaves by os._exit
        report()
        leave(code)
    os._exit = exit_reporting
    sys.argv = ["ustack", *sys.argv[1:]]
    from ustack.cli import entry
    try:
        entry()
    finally:
        report()


if __name__ == "__main__":
    main()
