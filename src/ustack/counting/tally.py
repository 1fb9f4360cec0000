"""A run's samples counted by (event, thread, stack): each sample of the
stream once (as the capture settles it), then what the kernel counted;
with --weight, each count is the sum of the weights."""
from __future__ import annotations

from ..model import RawSample, StackCount, unwound_sample
from ..probes.weight import as_s64


def counts(session) -> list:
    """Run to the end; the StackCounts of every distinct stack."""
    counted: dict = {}                  # (probe, tid, resolver key) -> count
    add_counts(session, counted, counted_samples(session))
    return stack_counts(session, counted, session.resolver.stack_of)


def run_through(session) -> None:
    """Run to the end naming nothing (a recording saves what passes)."""
    for _counted in counted_samples(session):
        pass


def counted_samples(session):
    """(sample, count): each sample of the stream once (as the capture
    settles it), then what the kernel counted."""
    settle = session.capture.settle
    weighed = session.weight is not None

    def unwound(s):
        return unwound_now(session, s)

    for piece in session.pieces():
        for s in piece.samples:
            yield settle(s, unwound), weight_of(s) if weighed else 1
    counted = kernel_counted(session)
    session.whole = True
    yield from counted


def kernel_counted(session, reset: bool = False) -> list:
    """(sample, count) the kernel counted (so far: `reset` zeroes it), of
    the run's processes; [] where the kernel counts nothing."""
    capture = session.capture
    if not capture.counts_in_kernel:
        return []
    exclude = session.target.excluded_pids(session.opts.include_idle)
    keep = session.keep
    comm = session.tracker.comm
    counted = [(s, n) for s, n in capture.counted(reset)
               if s.pid not in exclude and (keep is None or keep(s, comm(s.pid, s.tid)))]
    if session.recorder is not None:
        session.recorder.add_counted(counted)
    return counted


def unwound_now(session, s: RawSample) -> tuple:
    """(UnwoundSample, kernel frames, whether its addresses key it alone:
    nothing noted and its process's mappings unchanged since)."""
    pid, generation, (addrs, notes), kernel = session.resolver.key(s)
    keyable = not notes and generation == session.tracker.generations.get(pid, 0)
    return unwound_sample(s, addrs, notes), kernel, keyable


def add_counts(session, counted: dict, samples) -> None:
    """(sample, count) pairs added to `counted` by (probe, tid, resolver key)."""
    key = session.resolver.key
    for s, n in samples:
        k = (s.probe, s.tid, key(s))
        counted[k] = counted.get(k, 0) + n


def stack_counts(session, counted: dict, stack_of) -> list:
    """The StackCounts of `counted`, stacks named by `stack_of(resolver key)`."""
    tracker = session.tracker
    comm, ns_id = tracker.comm, tracker.ns_id
    if session.weight is not None:      # as the kernel's signed 64-bit sums
        counted = {k: as_s64(n) for k, n in counted.items()}
    per_thread, labels = session.opts.per_thread, session.labels
    return [StackCount(comm(rkey[0], tid, rkey[1]), rkey[0], stack_of(rkey), n,
                       labels[probe], tid if per_thread else 0,
                       ns_id(rkey[0]), ns_id(tid) if per_thread else 0)
            for (probe, tid, rkey), n in counted.items()]


def weight_of(sample: RawSample) -> int:
    """The value a weighted run sums for an event: its one fetch-arg (0
    where the record could not hold it)."""
    args = sample.args
    value = args[0][2] if args else None
    return value if isinstance(value, int) else 0
