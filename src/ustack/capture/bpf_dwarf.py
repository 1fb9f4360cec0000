"""Stacks unwound in the kernel with DWARF (capture/bpf_unwind.py's
programs): counted there (`count`, `profile`), or a record per event
through a BPF ring buffer (`trace`)."""
from __future__ import annotations

import os

from ..model import Losses, RawSample
from .bpf_capture import BpfCapture, uncounted
from .bpf_counter import ring_bytes
from .bpf_unwind import (KernelUnwinder, RingChunk, count_ring_samples, deferral_ring_bytes,
                         ring_samples)


class UnwindCountCapture(BpfCapture):
    """Stacks walked and counted in the kernel; the stacks it could not walk
    yet (an object mapped before its rows loaded) come through its ring as
    deferred records, unwound by ustack (settle)."""
    ring_chunk = RingChunk
    unwind_note = "unwound in the kernel"
    python_code = None      # the run's PythonCode (symbols/python.py): names code objects

    def __init__(self, probes: list, target, buffer_pages=None, *, python: bool = False,
                 **kwargs):
        super().__init__(probes, target, buffer_pages, **kwargs)
        # Python frames in the stacks (bpf/python.h, capture/bpf_python.py)
        self.python = python

    def _new_counter(self) -> KernelUnwinder:
        counter = KernelUnwinder(self.probes, self.owned, self.unwind_tables,
                        stack_storage=self.stack_storage, kernel=self.kernel,
                        filter_tgid=self._tgid(), armed=self.armed, python=self.python,
                        ring_bytes=deferral_ring_bytes(self.buffer_pages))
        self._follow_python(counter)
        return counter

    def _follow_python(self, counter: KernelUnwinder) -> None:
        """The Python processes running now (-p, system-wide) into the
        counter's map before its programs attach; a -c command's
        interpreter read before it runs and its maps watched after exec."""
        python = counter.python
        if python is None:
            return
        from ..kernel import procfs
        from .bpf_unwind import objects_of_target
        python.python_code = self.python_code
        scope = self.target.scope
        if scope == "command":
            # its interpreter read before it runs, its maps watched after exec
            if python.warm(objects_of_target(self.target, self.probes)) \
                    and self.armed is not None:
                python.watch_command(self.target.pid, self.armed)
        else:               # the Python processes running now (-p, system-wide)
            python.add_running([self.target.pid] if scope == "pid" else procfs.pids())

    def decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        """BpfCapture's, with the Python processes followed as the records
        say (an interpreter mapped, an exec, an exit)."""
        before = len(metas)
        offset = super().decode(chunk, metas, samples, offset, limit)
        python = self.counter.python if self.counter is not None else None
        if python is not None and len(metas) > before:
            python.follow(metas[before:])
        return offset

    def count_samples(self, chunk, start: int) -> int:
        """BpfCapture's, but for the ring's records naming Python code objects."""
        if not isinstance(chunk, self.ring_chunk):
            return super().count_samples(chunk, start)
        return count_ring_samples(chunk, start)

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of every stack counted so far; a sample's time
        and CPU are 0 and -1 (the kernel kept neither)."""
        counter = self.counter
        out = []
        for pid, tid, probe, chain, kstack, n in counter.unwound(reset):
            kernel = counter.stack_bytes(kstack) if self.kernel else b""
            out.append((RawSample(probe, pid, tid, 0, -1, chain, b"", kernel=kernel), n))
            self._note_cut(chain, n)
        return out

    def _decode_ring(self, chunk, samples: list, offset: int, limit: int) -> int:
        """The unwinder's records (trace's, and the stacks it deferred to
        us) as RawSamples."""
        python = self.counter.python
        return ring_samples(chunk, samples, offset, limit, self.counter.stack_bytes,
                            self.counter.fetches, self._object_bytes,
                            python.code_seen if python is not None else None,
                            self._cut_one)

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

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
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
        counter = KernelUnwinder(self.probes, self.owned, self.unwind_tables,
                        stack_storage=self.stack_storage, kernel=self.kernel,
                        filter_tgid=self._tgid(), armed=self.armed, trace=True,
                        fetches=self.fetches, python=self.python,
                        ring_bytes=ring_bytes(self.buffer_pages))
        self._follow_python(counter)
        return counter

    def counted(self, reset: bool = False) -> list:
        return []

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
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
