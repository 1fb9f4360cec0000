#!/usr/bin/env python3
"""When in one ustack run its CPU is spent: the process's CPU (user +
system, every thread; not its children) at each step of the run's life,
as a user runs it:

    sudo .venv/bin/python bench/cpu_phases.py trace syscall:write -c 'echo hello'
    sudo .venv/bin/python bench/cpu_phases.py profile -F 99 -p PID -d 2

Steps: the interpreter until this script's first line; importing the
command line (ustack.cli); importing the run (ustack.commands.run: the
session and its stages); set-up until the capture opens (probes resolved,
the -c command launched held, the guardian forked); the capture opened
(BPF programs verified, maps made, rows loaded); the stream until the
run closes (sampling, naming, the report); closing; the summary; exit.
Where a step's CPU goes inside it: bench/cpu_parts.py. The repository's
src/ comes first on the path."""
from __future__ import annotations

import os
import resource
import sys

AT_START = resource.getrusage(resource.RUSAGE_SELF)
# (no pathlib: its imports, re and enum among them, would be counted
# before ustack's and taken from ustack.cli's)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                "src"))


def _cpu_ms(usage=None) -> float:
    usage = usage or resource.getrusage(resource.RUSAGE_SELF)
    return (usage.ru_utime + usage.ru_stime) * 1000


marks = [("the interpreter until this script", _cpu_ms(AT_START))]


def mark(step: str) -> None:
    marks.append((step, _cpu_ms()))


def marked(owner, name: str, step: str) -> None:
    """owner.name, marking the CPU before and after each call."""
    fn = getattr(owner, name)

    def call(*args, **kwargs):
        mark(f"before {step}")
        try:
            return fn(*args, **kwargs)
        finally:
            mark(f"after {step}")
    setattr(owner, name, call)


def report() -> None:
    before = 0.0
    for step, at in marks:
        print(f"{at:7.1f} ms  (+{at - before:5.1f})  {step}", file=sys.stderr)
        before = at


def main() -> None:
    from ustack import cli
    mark("ustack.cli imported")
    from ustack.commands import run
    mark("ustack.commands.run imported")
    from ustack import plan, session
    from ustack.kernel import guardian
    from ustack.target import ahead
    marked(session, "resolve_probes", "resolving the probes")
    marked(plan, "launch_target", "launching the -c command")
    marked(ahead, "prepare", "ahead.prepare")
    marked(guardian, "start", "forking the guardian")
    marked(session.Session, "_open_capture", "opening the capture")
    marked(session.Session, "close", "closing")
    marked(run, "write_summary", "the summary")
    leave = os._exit

    def exit_reporting(code: int) -> None:     # ustack leaves by os._exit
        mark("exit")
        report()
        leave(code)
    os._exit = exit_reporting
    sys.argv = ["ustack", *sys.argv[1:]]
    cli.entry()


if __name__ == "__main__":
    main()
