"""Where each thread's struct pthread (glibc's thread block) is, found from
outside the process, for what it keeps: a Perl ithread's interpreter is its
PL_thr_key value there (perl_live.py). The kernel has it at the thread's
fsbase, which user space does not see.

glibc puts the block of a thread it started at the top of the thread's
stack mapping (a private writable mapping of no file), below which the
stack grows; the block starts with its tcbhead_t, whose tcb and self words
point at the block itself, and holds its thread's tid: only such a block
is taken, never a guess. The tops of those mappings are searched once
when a thread is met, again when a thread is not found (at most every
RESCAN_S s) or its block no longer holds its tid (a thread gone, its
stack reused)."""
from __future__ import annotations

import struct
import time

from ..kernel import procfs
from .perl_runtime import PTHREAD_TID

TOP_BYTES = 16 << 10            # of a mapping's top searched (the block is in its last 4 KiB)
BLOCK_ALIGN = 64                # struct pthread's alignment
MIN_STACK = 16 << 10            # glibc's smallest thread stack (PTHREAD_STACK_MIN)
MAX_MAPPINGS = 4096             # mappings searched at most
RESCAN_S = 0.5
_TCBHEAD = struct.Struct("<QQQ")  # tcbhead_t's first words: tcb, dtv, self
_U32 = struct.Struct("<I")


class ThreadBlocks:
    """tid -> the address of its struct pthread, in process pid."""

    def __init__(self, pid: int, mem):
        self.pid, self.mem = pid, mem
        self.blocks: dict = {}
        self.scanned = float("-inf")

    def of(self, tid: int) -> int | None:
        """The struct pthread of thread tid, or None where none is found."""
        block = self.blocks.get(tid)
        if block is not None and self._holds(block, tid):
            return block
        if time.monotonic() - self.scanned < RESCAN_S and block is None:
            return None
        self._scan()
        return self.blocks.get(tid)

    def _holds(self, block: int, tid: int) -> bool:
        try:
            return _U32.unpack(self.mem.read(block + PTHREAD_TID, 4))[0] == tid
        except OSError:
            return False

    def _scan(self) -> None:
        self.scanned = time.monotonic()
        found: dict = {}
        for start, end in procfs.anonymous_writable(self.pid)[:MAX_MAPPINGS]:
            if end - start < MIN_STACK:
                continue
            low = max(start, end - TOP_BYTES)
            try:
                data = self.mem.read(low, end - low)
            except OSError:
                continue
            for at in range(0, len(data) - PTHREAD_TID - 4, BLOCK_ALIGN):
                addr = low + at
                tcb, _dtv, self_ = _TCBHEAD.unpack_from(data, at)
                if tcb == addr and self_ == addr:
                    found[_U32.unpack_from(data, at + PTHREAD_TID)[0]] = addr
        self.blocks = found
