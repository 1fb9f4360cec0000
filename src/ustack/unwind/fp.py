"""Frame-pointer stacks: the kernel walked them; we repair the one frame it
cannot see. At a uprobe on a function's entry (before `mov %rsp,%rbp`) rbp
still belongs to the caller, so the walk goes from the probed ip straight to
the caller's caller: the return address into the immediate caller sits on
the stack at the probe's return_address_slot, which the capture reads (the
RawSample's `return_address`)."""
from __future__ import annotations

import struct
from collections.abc import Callable

_CONTEXT_MARKER = 0xFFFFFFFFFFFFF000    # PERF_CONTEXT_* values are above this
_STRUCTS: dict = {}


def callchain_addresses(callchain: bytes) -> tuple:
    """The u64 little-endian addresses of a RawSample's callchain."""
    n = len(callchain) // 8
    s = _STRUCTS.get(n)
    if s is None:
        s = _STRUCTS[n] = struct.Struct(f"<{n}Q")
    return tuple(ip for ip in s.unpack_from(callchain) if ip < _CONTEXT_MARKER)


def frame_pointer_stack(callchain: bytes, return_address: bytes = b"",
                        is_code: Callable[[int], bool] | None = None) -> tuple:
    """Return addresses of a frame-pointer sample, innermost first."""
    ips = _until_garbage(callchain_addresses(callchain))
    if len(return_address) != 8 or not ips:
        return ips
    ret = int.from_bytes(return_address, "little")
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
