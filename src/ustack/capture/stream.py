"""The run's stream of Pieces from any capture: a drain thread empties the
kernel buffers into a bounded backlog while the caller decodes, a piece at
a time, into RawSamples and the metadata that explains them."""
from __future__ import annotations

import threading
import time
from collections import deque
from operator import attrgetter

from ..model import Losses, Piece
from ..values import fields
from .perf import READ_MOST

_time = attrgetter("time_ns")

DRAIN_POLL_MS = 5                  # how often the drain thread empties buffers
DRAIN_IDLE_MS = 40                 # ... grown to this while they stay empty (a quiet run
                                   # wakes 25 times a second, not 200)
PIECE = 64 << 10                   # bytes of a chunk decoded in one step
BACKLOG_LIMIT = 64 << 20           # bytes of undecoded records held in memory (RSS <= 200 MB)


class _Drainer(threading.Thread):
    """Empties the kernel ring buffers into a bounded in-memory backlog, on
    its own thread: decoding on the main thread (an ELF parsed on first
    use, a burst of new stacks) then cannot stall the draining long enough
    for the kernel buffers to overflow. poll() releases the GIL, and Python
    hands the GIL over every few ms, so this thread keeps up."""

    def __init__(self, capture, ends_at: float | None = None):
        super().__init__(name="ustack-drain", daemon=True)
        self.capture = capture
        self.ends_at = ends_at             # -d: the events stop then, here
        self.stopped_at: float | None = None    # time.monotonic() when it stopped them
        self.queue: deque = deque()        # [batch, offsets, read_at]
        # time.monotonic() before a read that found every buffer empty: all
        # sent before it was queued by then
        self.empty_at = 0.0
        self.bytes = 0
        self.ready = threading.Event()
        self._stop_flag = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        wait = DRAIN_POLL_MS
        while not self._stop_flag.is_set():
            if self.ends_at is not None and time.monotonic() >= self.ends_at:
                # on time, whatever the decoding thread is busy with (a cold
                # run builds an object's rows for seconds): what was sent
                # until now is read by Stream.rest_within()
                self.stopped_at = time.monotonic()
                self.capture.stop()
                return
            if self.bytes >= BACKLOG_LIMIT:
                time.sleep(0.005)          # let the kernel count what is lost
                continue
            read_at = time.monotonic()
            batch = self.capture.read_chunks(wait)
            if batch:
                with self._lock:
                    self.bytes += sum(map(len, batch))
                # a buffer read to its limit may hold more: then the batch
                # does not hold all that was sent before read_at
                whole = all(len(chunk) < READ_MOST for chunk in batch)
                self.queue.append([batch, [0] * len(batch), read_at if whole else None])
                self.ready.set()
                wait = DRAIN_POLL_MS
            else:                          # a quiet run: wake less often
                self.empty_at = read_at
                wait = min(2 * wait, DRAIN_IDLE_MS)

    def next_batch(self, timeout: float):
        """The oldest batch (possibly partly decoded), or None after timeout."""
        if not self.queue:
            self.ready.clear()
            if not self.queue:
                self.ready.wait(timeout)
        return self.queue[0] if self.queue else None

    def done(self, entry) -> None:
        self.queue.popleft()
        with self._lock:
            self.bytes -= sum(map(len, entry[0]))

    def finish(self) -> None:
        self._stop_flag.set()
        if self.is_alive():
            self.join()


class Stream:
    """Pieces of one capture: `follow` while the run lasts, then `rest`.
    Samples of the processes in `exclude_pids` are left out; at `ends_at`
    (time.monotonic(), -d) the events stop."""

    def __init__(self, capture, exclude_pids=frozenset(), ends_at: float | None = None):
        self.capture = capture
        self.exclude_pids = frozenset(exclude_pids)
        self._drainer = _Drainer(capture, ends_at)
        self.dropped_samples = 0         # see rest_within()
        # time.monotonic() when the events were stopped: the samples end there
        self.stopped_at: float | None = None
        self._decoded_until = 0.0        # see decoded_until()

    def start(self) -> None:
        self.capture.start()
        self._drainer.start()

    def _piece(self, batch: list, offsets: list):
        """Decode up to PIECE bytes of each chunk of a batch: (Piece, done).
        Every chunk's metadata comes before any sample of the piece, in time
        order across CPUs: a sample may sit in another CPU's buffer ahead of
        the MMAP2 record that explains it, and an exec's COMM on one CPU must
        come before the MMAP2s it caused on another. The samples too are put
        in one time order (each CPU's are in order already: timsort merges
        the runs), so a stack per event prints as the events happened, as
        perf script does, when a thread moved between CPUs."""
        metas: list = []
        samples: list = []
        decode = self.capture.decode
        done = True
        for i, chunk in enumerate(batch):
            offsets[i] = decode(chunk, metas, samples, offsets[i], PIECE)
            done = done and offsets[i] >= len(chunk)
        metas.sort(key=lambda m: m[0])      # stable: a CPU's own order stays
        if len(batch) > 1:
            samples.sort(key=_time)
        if self.exclude_pids and samples:
            exclude = self.exclude_pids
            samples = [s for s in samples if s.pid not in exclude]
        return Piece([event for _t, event in metas], samples), done

    def follow(self, timeout: float, budget: float):
        """Pieces of the oldest queued batch for about `budget` seconds,
        after waiting up to `timeout` for one (none if nothing came)."""
        entry = self._drainer.next_batch(timeout)
        if entry is None:
            return
        slice_end = time.monotonic() + budget
        while True:
            piece, done = self._piece(entry[0], entry[1])
            yield piece
            if done:
                self._drainer.done(entry)
                if entry[2] is not None:
                    self._decoded_until = entry[2]
                return
            if time.monotonic() > slice_end:
                return

    def decoded_until(self) -> float:
        """time.monotonic() before which all that was sent has been
        decoded (its pieces handed out by follow()): the read time of the
        last batch decoded whole, or of a read that found nothing since."""
        empty_at = self._drainer.empty_at      # before looking at the queue
        if not self._drainer.queue:
            return max(empty_at, self._decoded_until)
        return self._decoded_until

    def rest(self):
        """After the run: stop the events and the drain thread, then the
        pieces of what is queued, what the buffers still hold and the
        losses the kernel was still holding back."""
        self._drainer.finish()          # before the buffers are unmapped
        self._stop_events()
        queue = self._drainer.queue
        while queue:
            batch, offsets, _read_at = queue.popleft()
            yield from self._pieces(batch, offsets)
        for flushed in (False, True):
            if flushed:
                self.capture.flush_lost()
            while True:
                batch = self.capture.read_chunks(0)
                if not batch:
                    break
                yield from self._pieces(batch, [0] * len(batch))

    def rest_within(self, budget: float, asked_to_end):
        """rest() for a run whose time is up: what was sent and is not read
        yet is decoded, all of it, until asked_to_end() is true (Ctrl-C,
        maybe before this began); from then on for `budget` seconds (the
        consumer's time included), and what is left is counted
        (self.dropped_samples), not decoded nor reported, so the run ends
        at once however long its backlog."""
        self._drainer.finish()
        self._stop_events()
        queue = self._drainer.queue
        deadline = None

        def within() -> bool:
            nonlocal deadline
            if deadline is None:
                if not asked_to_end():
                    return True
                deadline = time.monotonic() + budget
            return time.monotonic() < deadline

        def batches():
            while queue:
                yield queue.popleft()[:2]
            while True:
                batch = self.capture.read_chunks(0)
                if not batch:
                    return
                yield batch, [0] * len(batch)

        for batch, offsets in batches():
            while within():
                piece, done = self._piece(batch, offsets)
                yield piece
                if done:
                    break
            else:
                yield from self._dropped(batch, offsets)

    def _stop_events(self) -> None:
        self.stopped_at = self._drainer.stopped_at or time.monotonic()
        self.capture.stop()

    def losses(self) -> Losses:
        """The capture's losses, and the events dropped unread at the end."""
        losses = self.capture.losses()
        if not self.dropped_samples:
            return losses
        return Losses(**{**{f: getattr(losses, f) for f in fields(losses)},
                         "dropped": self.dropped_samples})

    def _dropped(self, batch: list, offsets: list):
        counts = [self.capture.count_samples(chunk, at) for chunk, at in zip(batch, offsets)]
        if None not in counts:
            self.dropped_samples += sum(counts)
            return
        for piece in self._pieces(batch, offsets):      # no counting short of decoding
            self.dropped_samples += len(piece.samples)
            yield Piece(piece.metas, ())

    def _pieces(self, batch: list, offsets: list):
        while True:
            piece, done = self._piece(batch, offsets)
            yield piece
            if done:
                return

    def close(self) -> None:
        self._drainer.finish()
