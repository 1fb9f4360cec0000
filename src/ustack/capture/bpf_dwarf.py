"""Stacks unwound in the kernel with DWARF (capture/bpf_unwind.py's
programs): counted there (`count`, `profile`), or a record per event
through a BPF ring buffer (`trace`)."""
from __future__ import annotations

import os

from ..model import Losses, RawSample
from .bpf_capture import BpfCapture, uncounted
from .bpf_counter import ring_bytes
from ..probes.weight import as_s64
from .bpf_unwind import (DEFAULT_ROWS, KernelUnwinder, RingChunk, deferral_ring_bytes,
                          ring_samples)


class UnwindCountCapture(BpfCapture):
    """Stacks walked and counted in the kernel; the stacks it could not walk
    yet (an object mapped before its rows loaded) come through its ring as
    deferred records, unwound by ustack (settle)."""
    ring_chunk = RingChunk
    unwind_note = "unwound in the kernel"
    links_uprobes = True    # its programs can learn the probe from a link's cookie
    defers_stacks = True    # through its ring (deferred records)
    defers_table_full = True
    jvm_deferred = 0        # stacks through a JVM's JIT code deferred (at losses())

    def _new_counter(self) -> KernelUnwinder:
        return KernelUnwinder(self.probes, self.owned, self.unwind_tables,
                              stack_storage=self.stack_storage, kernel=self.kernel,
                              filter_tgid=self._tgid(), armed=self.armed, python=self.python,
                              js=self.js, php=self.php, perl=self.perl, ruby=self.ruby,
                              rows=self.rows_capacity or DEFAULT_ROWS,
                              stack_size=self.stack_size,
                              ring_bytes=deferral_ring_bytes(
                                  self.buffer_pages, self.stack_size,
                                  command=self.target.scope == "command"),
                              weighted=self.weighted, linked=self.linked)

    def read_chunks(self, timeout_ms: int) -> list:
        """BpfCapture's; and the stacks moved to user space when STACKS
        fills (KernelUnwinder.spill), counting only."""
        chunks = super().read_chunks(timeout_ms)
        counter = self.counter
        if counter is not None and not counter.trace:
            counter.spill()
        return chunks

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of every stack counted so far; a sample's time
        and CPU are 0 and -1 (the kernel kept neither)."""
        counter = self.counter
        out = []
        for pid, tid, probe, chain, kstack, n in counter.unwound(reset):
            kernel = counter.stack_bytes(kstack) if self.kernel else b""
            out.append((RawSample(probe, pid, tid, 0, -1, chain, b"", kernel=kernel),
                        as_s64(n) if self.weighted else n))
            self._note_cut(chain, n)
        return out

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        """The unwinder's records (trace's, and the stacks it deferred to
        us) as RawSamples."""
        python = self.counter.python
        frames = self.python_frames
        return ring_samples(chunk, samples, offset, limit, self.counter.stack_bytes,
                            self.counter.fetches, self._object_bytes,
                            python.code_seen if python is not None else None,
                            self._cut_one, self.weighted,
                            frames.read if frames is not None and python is not None else None,
                            frames.chain if frames is not None and python is not None else None)

    def _cut_one(self, chain: bytes) -> None:
        self._note_cut(chain, 1)

    def _object_bytes(self, dev: int, inode: int, offset: int, size: int) -> bytes | None:
        """`size` bytes at `offset` of an object whose unwind rows are
        loaded, by its (kernel dev, inode); None for another file."""
        entry = self.counter.objects.loaded.get((dev, inode)) if self.counter else None
        if entry is None:
            return None
        try:
            with open(entry[0], "rb") as f:
                return os.pread(f.fileno(), size, offset)
        except OSError:
            return None

    def end_notes(self) -> list:
        """BpfCapture's, and how many stacks went through a JVM's JIT
        code, which the kernel hands over to be walked by ustack (their
        Java frames: unwind/hotspot_live.py); another JIT's code is walked
        on its frame pointer in the kernel."""
        notes = super().end_notes()
        if self.jvm_deferred:
            n = self.jvm_deferred
            notes.append(f"{n} stack{'s' if n != 1 else ''} through a JVM's JIT code "
                         "walked by ustack from copies")
        return notes

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        self.jvm_deferred = errors.get("UW_JVM_DEFERRED", 0)
        return Losses(events.lost, events.throttled, uncounted(errors, (
            ("found the stack map full", "UW_STACKS_FULL"),
            ("found the count map full", "UW_COUNTS_FULL"))),
            tuple(self.cut.items()), deferral_full=errors["UW_UNDEFERRED"],
            skipped=skipped)


class UnwindTraceCapture(UnwindCountCapture):
    """`trace`: every event's stack, walked in the kernel, through the
    unwinder's ring with the values of its fetch-args; nothing counted."""
    counts_in_kernel = False

    def __init__(self, probes: list, target, buffer_pages=None, **kwargs):
        super().__init__(probes, target, buffer_pages, **kwargs)
        # per probe, its fetch-args as the trace program fetches them
        self.fetches = _compiled_fetches(probes)

    def _new_counter(self) -> KernelUnwinder:
        return KernelUnwinder(self.probes, self.owned, self.unwind_tables,
                              stack_storage=self.stack_storage, kernel=self.kernel,
                              filter_tgid=self._tgid(), armed=self.armed, trace=True,
                              rows=self.rows_capacity or DEFAULT_ROWS, js=self.js, php=self.php,
                              perl=self.perl, ruby=self.ruby,
                              stack_size=self.stack_size, fetches=self.fetches, python=self.python,
                              ring_bytes=ring_bytes(self.buffer_pages), linked=self.linked)

    def counted(self, reset: bool = False) -> list:
        return []

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        self.jvm_deferred = errors.get("UW_JVM_DEFERRED", 0)
        return Losses(events.lost + errors["UW_RING_FULL"], events.throttled, (),
                      tuple(self.cut.items()), deferral_full=errors["UW_UNDEFERRED"],
                      skipped=skipped)


def _compiled_fetches(probes: list) -> tuple:
    """Each probe's fetch-args compiled for the trace program (None for
    a probe without); bpf_fetchargs is imported only where one has some."""
    if not any(getattr(p, "fetch_args", ()) for p in probes):
        return ()
    from .bpf_fetchargs import compile_args
    return tuple(compile_args(p) if getattr(p, "fetch_args", ()) else None
                 for p in probes)
