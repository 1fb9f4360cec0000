#!/usr/bin/env python3
"""The in-kernel DWARF unwinder's size and verifier cost, per kind of probe
and per use (count: stacks counted in maps; trace: a record per event into
a ring): instructions of src/ustack/bpf/unwind.bpf.c's program (its own,
not the functions it calls) and the instructions the verifier processed
(`verified_insns`).

    sudo python3 bench/bpf_unwind_size.py      # src/ of this checkout

Loads each program once with small maps; attaches nothing."""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from ustack.capture import bpf_unwind as uw  # noqa: E402
from ustack.kernel import bpf_syscall  # noqa: E402
from ustack.model import ProbeSpec, ProfileProbe, TracepointProbe, UprobeProbe  # noqa: E402

PROBES = {
    "uprobe": UprobeProbe(ProbeSpec("uprobe", "u"), "/bin/true", 0, 0, None, 0, None, "u"),
    "tracepoint": TracepointProbe(ProbeSpec("syscall", "s"), "syscalls", "sys_enter_write", "s"),
    "profile": ProfileProbe(ProbeSpec("profile", "p"), 99, "p"),
}


def measure(probe, use: str) -> tuple:
    """(instructions, verified instructions) of one program."""
    maps = uw.UnwindMaps(16, 16, 16, objects=16, vmas=16, pages_capacity=16)
    ring = bpf_syscall.RingBuf(1 << 20, "ustack_szring")
    try:
        program = f"unwind_{use}"
        fd = uw.load_program(program, maps, 0, probe, ring=ring, name="ustack_size")
        try:
            return (len(uw.unwind_object().programs[program].code) // 8,
                    bpf_syscall.verified_insns(fd))
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
