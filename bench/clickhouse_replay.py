"""The ClickHouse sink's queueing CPU per new stack, replayed offline on a
captured whole-machine run: the same Stacks and Frames (as the
symbolizer handed them out, copies and all) through two trees' code,
alternated, in processes of their own, each checked to queue the same
bytes.

    python3 bench/clickhouse_replay.py capture FILE [SECONDS]   (root: a
        whole-machine -F 49 --every 20 run, default 60 s, sent to a private
        clickhouse-server; each interval's counts kept in FILE)
    python3 bench/clickhouse_replay.py replay FILE ROUNDS [OTHER_SRC]
        (ROUNDS alternated runs of OTHER_SRC's queueing then this tree's)

The processes' facts (/proc: executable, container; unchanged by the
stacks' code, ~4 us a new stack live) are left out, so that both trees
queue the same bytes whichever processes have ended since the capture.
Offline the Frames are hot and the heap is compact: live, each new stack
costs ~1.2-1.5 times what it costs here (bench/clickhouse.py `sending`
measures that, but its noise from run to run is larger than a change).
What the live sink does as places are named (Symbolizer.on_named: frames
read while warm, copies made after carrying their originals' ids) does
not happen here: every Frame is read at its interval's end."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")

# the one process's side of `replay`: queue every interval, as the sink
# does, with the sender's confirmations in between; print CPU and digest
REPLAY_ONE = r"""
import gc, hashlib, pickle, sys, time
from ustack.report.sinks import clickhouse_sink as cs
with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
gc.freeze()                          # as cli.py leaves the collector for a command
gc.set_threshold(20_000, *gc.get_threshold()[1:])
copied = {id(copy): original for *_, pairs in data for copy, original in pairs}
known, facts = cs.SentStacks(), cs.ProcessFacts()
facts.of = lambda pid: ("/usr/bin/x", "", "")   # the processes are gone: /proc not asked
known.rows.copied_from = copied
digest, stacks = hashlib.sha1(), set()
began = time.thread_time()
for start_ns, duration_ns, counts, _ in data:
    batch = cs.interval_batch("bench", "replay", start_ns, duration_ns, counts, facts,
                              False, known)
    for part in cs.queued_parts(batch):
        digest.update(part)
    stacks.update(batch["stacks"])
    known.confirmed.update(batch["stacks"])      # as the sender, once sent
    known.confirmed_frames.update(batch["frames"])
spent = time.thread_time() - began
print(spent, len(stacks), digest.hexdigest())
"""


def capture(path: str, seconds: int) -> None:
    """A whole-machine run in this process, the sink's put() wrapped to keep
    each interval's counts and which Frames are copies of which."""
    sys.path.insert(0, SRC)
    sys.path.insert(0, HERE)
    from clickhouse import start_server
    from ustack import cli
    from ustack.report.sinks import clickhouse_sink
    kept = []
    put = clickhouse_sink.ClickHouseSink.put

    def keeping(sink, start_ns, duration_ns, counts, copied_from=None):
        counts = list(counts)
        pairs = [(f, copied_from[id(f)]) for sc in counts for f in sc.stack.frames
                 if copied_from and id(f) in copied_from]
        kept.append((start_ns, duration_ns, counts, pairs))
        return put(sink, start_ns, duration_ns, counts, copied_from)
    clickhouse_sink.ClickHouseSink.put = keeping
    with tempfile.TemporaryDirectory() as root:
        proc, port = start_server(root)
        try:
            status = cli.main(["profile", "-F", "49", "--every", "20", "-d", str(seconds),
                               "--to", f"clickhouse://127.0.0.1:{port}/capture",
                               "--host-label", "bench", "--queue", f"{root}/queue"])
        finally:
            proc.terminate()
            proc.wait()
    if status != 0:
        raise SystemExit(status)
    # the ids the run's sink kept on its Frames and Stacks (sink_id) are
    # not kept: a replay reads every one afresh, as the sink first did
    for *_, counts, _pairs in kept:
        for sc in counts:
            vars(sc.stack).pop("sink_id", None)
            for frame in sc.stack.frames:
                vars(frame).pop("sink_id", None)
    with open(path, "wb") as f:
        pickle.dump(kept, f, protocol=pickle.HIGHEST_PROTOCOL)
    print(f"{len(kept)} intervals, {sum(len(k[2]) for k in kept)} rows kept in {path}")


def replay_one(path: str, src: str) -> tuple:
    out = subprocess.run([sys.executable, "-c", REPLAY_ONE, path], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=src, PYTHONHASHSEED="0"))
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    spent, stacks, digest = out.stdout.split()
    return float(spent), int(stacks), digest


def replay(path: str, rounds: int, other_src: str | None) -> None:
    runs = [("other", other_src), ("this", SRC)] if other_src else [("this", SRC)]
    print("| round | code | load | queueing CPU s | new stacks | us a new stack | "
          "queued bytes' sha1 |")
    print("|---|---|---:|---:|---:|---:|---|")
    for n in range(1, rounds + 1):
        for label, src in runs:
            load = os.getloadavg()[0]
            spent, stacks, digest = replay_one(path, src)
            print(f"| {n} | {label} | {load:.1f} | {spent:.3f} | {stacks} | "
                  f"{1e6 * spent / max(stacks, 1):.1f} | {digest[:12]} |", flush=True)


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "capture":
        capture(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 60)
    elif len(sys.argv) >= 4 and sys.argv[1] == "replay":
        replay(sys.argv[2], int(sys.argv[3]), sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
