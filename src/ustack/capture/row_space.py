"""Free ranges of an array that may grow at its end: where the in-kernel unwinder's rows (and
page-index slots) of an object go, and where an evicted object's go back
(capture/unwind_objects.py's UnwindObjects). A bump pointer never gave room
back, so a long run whose processes come and go filled the table once and
sent every later object's stacks to user space.

Best fit over the free ranges (kept sorted by start; a range freed beside
another merges with it), so the big holes stay big for big objects. A run
holds tens to a few thousand objects: a linear pass over the ranges costs
microseconds beside the rows' copy into the kernel."""
from __future__ import annotations

import bisect


class RowSpace:
    """The free ranges of an array of `capacity` slots, all free at first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._starts: list = [0] if capacity > 0 else []   # sorted
        self._ends: list = [capacity] if capacity > 0 else []

    def copy(self) -> "RowSpace":
        """The same free ranges, to try a plan on (UnwindObjects' eviction)."""
        other = RowSpace(0)
        other.capacity = self.capacity
        other._starts, other._ends = list(self._starts), list(self._ends)
        return other

    @property
    def free(self) -> int:
        """Slots free in all."""
        return sum(e - s for s, e in zip(self._starts, self._ends))

    @property
    def used(self) -> int:
        return self.capacity - self.free

    @property
    def largest(self) -> int:
        """The longest free range: the most one object may take now."""
        return max((e - s for s, e in zip(self._starts, self._ends)), default=0)

    def ranges(self) -> list:
        """(start, end) of each free range, in order."""
        return list(zip(self._starts, self._ends))

    def fits(self, n: int) -> bool:
        return n <= self.largest

    @property
    def tail(self) -> int:
        """Free slots at the array's end: what a range growing it joins."""
        if self._ends and self._ends[-1] == self.capacity:
            return self._ends[-1] - self._starts[-1]
        return 0

    def grow(self, n: int) -> None:
        """`n` more slots at the array's end, free (joined to a free range
        that ends there)."""
        if n <= 0:
            return
        if self.tail:
            self._ends[-1] += n
        else:
            self._starts.append(self.capacity)
            self._ends.append(self.capacity + n)
        self.capacity += n

    def run_if_given_back(self, start: int, n: int) -> int:
        """How long the free range holding [start, start + n) would be once
        those held slots were given back (merged with the free ranges
        beside them): whether evicting one object makes room, without a copy."""
        i = bisect.bisect_right(self._starts, start)
        lo = self._starts[i - 1] if i > 0 and self._ends[i - 1] == start else start
        hi = self._ends[i] if i < len(self._starts) and self._starts[i] == start + n \
            else start + n
        return hi - lo

    def take(self, n: int) -> int | None:
        """The first slot of `n` contiguous slots now taken (the shortest
        free range that holds them, its start), or None where none does.
        n == 0 takes nothing and answers 0."""
        if n <= 0:
            return 0
        best = None
        for i, (s, e) in enumerate(zip(self._starts, self._ends)):
            if e - s >= n and (best is None or e - s < self._ends[best] - self._starts[best]):
                best = i
                if e - s == n:
                    break
        if best is None:
            return None
        start = self._starts[best]
        if self._ends[best] - start == n:
            del self._starts[best], self._ends[best]
        else:
            self._starts[best] = start + n
        return start

    def give_back(self, start: int, n: int) -> None:
        """Slots [start, start + n) free again, merged with the free ranges
        they touch. Raises ValueError for slots outside the array or free
        already (a bookkeeping error must not hand rows out twice)."""
        if n <= 0:
            return
        end = start + n
        if start < 0 or end > self.capacity:
            raise ValueError(f"slots {start}-{end} outside 0-{self.capacity}")
        i = bisect.bisect_right(self._starts, start)
        if (i > 0 and self._ends[i - 1] > start) or (i < len(self._starts)
                                                     and self._starts[i] < end):
            raise ValueError(f"slots {start}-{end} are free already")
        joins_left = i > 0 and self._ends[i - 1] == start
        joins_right = i < len(self._starts) and self._starts[i] == end
        if joins_left and joins_right:
            self._ends[i - 1] = self._ends[i]
            del self._starts[i], self._ends[i]
        elif joins_left:
            self._ends[i - 1] = end
        elif joins_right:
            self._starts[i] = start
        else:
            self._starts.insert(i, start)
            self._ends.insert(i, end)
