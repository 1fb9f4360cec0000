"""Which samples a run or a report keeps: perf's --pid, --tid and --comm."""
from __future__ import annotations
from ..values import value



@value
class SampleFilter:
    """Keep a sample when it matches every list given (an empty list
    matches all)."""
    pids: frozenset = frozenset()
    tids: frozenset = frozenset()
    comms: frozenset = frozenset()

    def __bool__(self) -> bool:
        return bool(self.pids or self.tids or self.comms)

    def __call__(self, sample, comm: str) -> bool:
        return ((not self.pids or sample.pid in self.pids)
                and (not self.tids or sample.tid in self.tids)
                and (not self.comms or comm in self.comms))
