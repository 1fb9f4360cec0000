"""The capture contract: what every capture (perf, the BPF modes, tracefs,
a recording) does for a run, so that capture/stream.py and the Session
drive any of them alike. A new capture is a subclass in a new module and a
line in capture/backends.py."""
from __future__ import annotations

from ..interrupt import NEVER
from ..model import Losses


class Capture:
    """One run's capture.

    start: open() sets up (probes, events, programs; closing what it
    opened if it fails), start() lets the run begin (a held -c command
    goes on). The stream: read_chunks(timeout_ms) hands out the bytes the
    kernel (or a recording) holds, decode(chunk, metas, samples, offset,
    limit) turns up to `limit` bytes of one into the one typed stream:
    (time, MmapEvent/CommEvent/ForkEvent/ExitEvent) into `metas`, RawSample
    into `samples`. Counting in the kernel: counted() gives (RawSample,
    count) at the end, and the stream carries metadata (and the stacks the
    kernel left to ustack: settle() makes each one countable with them).
    drain/close: stop() ends the events, read_chunks(0) until it returns
    nothing, flush_lost(); close() frees everything, once, on every path
    (or release() in this process, close() in another: `release`).
    lost/errors: losses() says what was lost (the kernel's counters) and
    what an in-kernel program could not count (its named error counters,
    capture/run_objects.py), read at the end of a run."""
    unwind_note = ""            # what the header adds about unwinding
    interrupt = NEVER           # the run's Interrupt: setting up gives up when asked
    buffer_pages = 0            # recorded in a recording's header
    counts_in_kernel = False    # counted() holds the run's stacks
    # a method: close() for this process alone, where a detached process
    # holds copies of the descriptors and closes them (capture/closer.py);
    # None: the capture closes in the foreground only
    release = None

    def open(self) -> None:
        raise NotImplementedError

    def defines_probes(self) -> bool:
        """Whether close() removes probes this capture defined in tracefs
        (seen by anyone until then; capture/closer.py)."""
        return True

    def start(self) -> None:
        """The run begins: a held -c command goes on."""

    def read_chunks(self, timeout_ms: int) -> list:
        """What the buffers hold, waiting up to timeout_ms for some."""
        raise NotImplementedError

    def decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        """Decode `chunk` from `offset` for about `limit` bytes; the offset
        reached (len(chunk) when done)."""
        raise NotImplementedError

    def count_samples(self, chunk, start: int) -> int | None:
        """The samples of a chunk from `start` without decoding them, or
        None where only decoding can tell."""
        return None

    def stop(self) -> None:
        """The events stop; what they sent can still be read."""

    def flush_lost(self) -> None:
        """Make the kernel report the losses it still holds back."""

    def losses(self) -> Losses:
        return Losses()

    def end_notes(self) -> list:
        """Lines the summary adds about how the run went (not losses)."""
        return []

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of every stack the kernel counted."""
        return []

    def settle(self, sample, unwind):
        """A sample of the stream as counted() would have it, so that equal
        stacks count under one key; `unwind(sample)` unwinds it now:
        (UnwoundSample, whether its addresses may be keyed raw)."""
        return sample

    def close(self) -> None:
        raise NotImplementedError
