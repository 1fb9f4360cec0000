"""Frame-pointer stacks: the kernel walked them; we repair the one frame it
cannot see. At a uprobe on a function's entry (before `mov %rsp,%rbp`) rbp
still belongs to the caller, so the walk goes from the probed ip straight to
the caller's caller: the return address into the immediate caller sits on
the stack at a known slot, captured with a few bytes of PERF_SAMPLE_STACK_USER."""
from __future__ import annotations

from typing import Callable, Optional

from ..model import Sample


def frame_pointer_stack(sample: Sample,
                        is_code: Optional[Callable[[int], bool]] = None) -> tuple:
    """Return addresses of `sample`, innermost first."""
    ips = _until_garbage(sample.ips)
    slot = sample.return_address_slot
    stack = sample.stack
    if slot is None or not stack or len(stack) < 8 * (slot + 1) or not ips:
        return ips
    ret = int.from_bytes(stack[8 * slot:8 * slot + 8], "little")
    if ret == 0 or (len(ips) > 1 and ips[1] == ret):
        return ips
    if is_code is not None and not is_code(ret):
        return ips                       # not a return address: leave as walked
    return ips[:1] + (ret,) + ips[1:]


def _until_garbage(ips: tuple) -> tuple:
    """Cut the walk at the first impossible return address: a frame pointer
    chain through code that does not keep rbp ends in 0 or a small number
    (never mapped: the first page is reserved)."""
    for i, ip in enumerate(ips):
        if ip < 0x1000:
            return ips[:i]
    return ips
