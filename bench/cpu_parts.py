#!/usr/bin/env python3
"""Where one ustack run's CPU goes, measured inside the run: the CPU time
(user + system) of the thread that does each part, summed over the
outermost calls, and the process's total at its exit.

    sudo .venv/bin/python bench/cpu_parts.py trace syscall:write -c 'echo hello'
    sudo .venv/bin/python bench/cpu_parts.py profile -F 99 -p PID -d 2

Parts: the interpreter until this script's first line; imports; BPF
program loads (the verifier); BTF loads; BPF maps made; unwind rows
loaded; ELF images opened; symbolization. The wrapping adds its own cost
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


def measured(part: str, fn):
    """fn, its CPU added to `part` (only where no measured call is under way
    in this thread: a part's own calls are not counted twice)."""
    def call(*args, **kwargs):
        if getattr(_inside, "busy", False):
            return fn(*args, **kwargs)
        _inside.busy = True
        start = _thread_cpu()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] = spent.get(part, 0.0) + _thread_cpu() - start
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


def main() -> None:
    builtins.__import__ = measured("imports", builtins.__import__)
    importlib.import_module = measured("imports", importlib.import_module)
    from ustack.kernel import bpf_object, bpf_syscall
    bpf_syscall.load_with_btf = measured("BPF program loads", bpf_syscall.load_with_btf)
    bpf_object.BpfObject._btf = measured("BTF loads", bpf_object.BpfObject._btf)
    bpf_syscall.Map.__init__ = measured("BPF maps made", bpf_syscall.Map.__init__)
    from ustack.capture import bpf_unwind
    bpf_unwind.UnwindObjects.add_path = measured("unwind rows",
                                                 bpf_unwind.UnwindObjects.add_path)
    from ustack.objfile import elf
    elf.ElfImage.open = classmethod(measured("ELF images opened", elf.ElfImage.open.__func__))
    from ustack.symbols import symbolizer
    symbolizer.Symbolizer.frames = measured("symbolization", symbolizer.Symbolizer.frames)
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
