"""Stacks walked by frame pointers and counted in the kernel (counts.bpf.c):
`count`/`profile --unwind fp`, and `--kernel`."""
from __future__ import annotations

from ..model import Losses, RawSample
from ..probes.weight import as_s64
from .bpf_capture import BpfCapture, uncounted
from .bpf_counter import BpfCounter


class StackCountCapture(BpfCapture):
    """bpf_get_stackid's stacks counted per (thread, probe, stacks, return
    address); the stream carries only metadata."""
    links_uprobes = True    # count_stack can learn the probe from a link's cookie

    def _new_counter(self) -> BpfCounter:
        return BpfCounter(self.probes, self.owned, stack_storage=self.stack_storage,
                          kernel=self.kernel, filter_tgid=self._tgid(), armed=self.armed,
                          weighted=self.weighted, linked=self.linked)

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of every stack counted so far; a sample's time
        and CPU are 0 and -1 (the kernel kept neither)."""
        counter = self.counter
        out = []
        for c in counter.counted(reset):
            slot = getattr(self.probes[c.probe], "return_address_slot", None)
            sample = RawSample(
                c.probe, c.pid, c.tid, 0, -1, counter.stack_bytes(c.user_stack),
                c.return_address.to_bytes(8, "little") if slot is not None else b"",
                kernel=counter.stack_bytes(c.kernel_stack) if self.kernel else b"")
            out.append((sample, as_s64(c.count) if self.weighted else c.count))
        return out

    def _losses(self, events: Losses, errors: dict, skipped: int) -> Losses:
        return Losses(events.lost, events.throttled, uncounted(errors, (
            ("had a stack id collision", "ERR_COLLISION"),
            ("found the stack map full", "ERR_STACKS_FULL"),
            ("found the count map full", "ERR_COUNTS_FULL"))), skipped=skipped)
