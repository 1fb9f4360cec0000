#!/usr/bin/env python3
"""The in-kernel DWARF unwinder's size and verifier cost, per kind of probe
and per use (count: stacks counted in maps; trace: a record per event into
a ring): instructions of the program (callbacks included) and the
instructions the verifier processed (`verified_insns`).

    sudo python3 bench/bpf_unwind_size.py      # src/ of this checkout

Loads each program once with small maps; attaches nothing."""
from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ustack.capture import bpf_unwind as uw  # noqa: E402
from ustack.capture.bpf import prog_type_of  # noqa: E402
from ustack.capture.kernel_offsets import Offsets  # noqa: E402
from ustack.kernel import bpf  # noqa: E402
from ustack.model import ProbeSpec, ProfileProbe, TracepointProbe, UprobeProbe  # noqa: E402

PROBES = {
    "uprobe": UprobeProbe(ProbeSpec("uprobe", "u"), "/bin/true", 0, 0, None, 0, None, "u"),
    "tracepoint": TracepointProbe(ProbeSpec("syscall", "s"), "syscalls", "sys_enter_write", "s"),
    "profile": ProfileProbe(ProbeSpec("profile", "p"), 99, "p"),
}


def measure(probe, use: str) -> tuple:
    """(instructions, verified instructions) of one program."""
    maps = uw.UnwindMaps(16, 16, 16, objects=16, vmas=16, pages_capacity=16)
    ring = bpf.RingBuf(1 << 20, "ustack_szring")
    try:
        program = uw.UnwindProgram(maps, Offsets.of_this_kernel())
        kw = {}
        deferring = "defer" in inspect.signature(program.code).parameters
        if use == "trace":
            kw["ring"] = ring
        if deferring:
            kw["defer"] = ring
        code, functions = program.code(0, probe, **kw)
        fd = bpf.load_program(prog_type_of(probe), code, "ustack_size", functions=functions)
        try:
            return len(code) // 8, bpf.verified_insns(fd)
        finally:
            os.close(fd)
    finally:
        ring.close()
        maps.close()


def main() -> None:
    print("| probe | use | instructions | verified instructions |")
    print("|---|---|---:|---:|")
    for name, probe in PROBES.items():
        for use in ("count", "trace"):
            n, verified = measure(probe, use)
            print(f"| {name} | {use} | {n} | {verified} |")


if __name__ == "__main__":
    main()
