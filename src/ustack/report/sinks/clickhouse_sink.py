"""profile --every ... --to clickhouse://HOST:PORT/DB: each interval's
counted stacks become rows (samples), each distinct stack a row of its
frames' ids (stack_frames) and each distinct frame a row (frames). The
sampling thread hands an interval to a background thread, which sends it
at once if it can; else the interval waits on disk (spool.py), and the
thread sends the queue, oldest first, and removes an interval once the
server has it. An interval goes in as one INSERT into
samples_in, whose views write three parts (samples and the two sums
tables), each all or nothing and each naming its batch; when an earlier
try may have reached the server (no answer came, or another run queued
it), the sender asks which of the three parts the server has and writes
exactly the others: nothing lost, nothing counted twice, in the sums too
(clickhouse_schema.py)."""
from __future__ import annotations

import json
import operator
import os
import secrets
import threading
import time
from collections import deque
from itertools import compress

from json.encoder import encode_basestring_ascii as _json   # json.dumps of a str, in C

from .clickhouse_http import Server, ServerError, quote
from .clickhouse_schema import (FRAMES, MARKER_EVENT, STACK_FRAMES, STACKS_IN, SUMS, StackRows,
                                create_statements, keep_sink_ids, sums_select)
from .spool import SUFFIX, Spool

RETRY_FIRST_S, RETRY_MAX_S = 0.2, 5.0
_SINK_ID = operator.attrgetter("sink_id")


_NO_EXECUTABLE = ("", "")


class ProcessFacts:
    """What a row says of a process beyond pid and comm, read once per pid
    while it lives: executable, its build-id, its container."""

    LIMIT = 10_000                   # pids (and executables) kept; past it, started afresh

    def __init__(self):
        self._facts: dict = {}
        self._build_ids: dict = {}   # the executable file's identity -> its build-id

    def of(self, pid: int) -> tuple:
        if pid not in self._facts:
            if len(self._facts) >= self.LIMIT:
                self._facts.clear()
            exe = self._executable(pid)
            # a process gone (or a kernel thread) has no executable, and is
            # in no container we could read: its cgroup is not tried
            self._facts[pid] = (exe, _container(pid) if exe is not None else "")
        exe, container = self._facts[pid]
        return (exe or _NO_EXECUTABLE) + (container,)

    def _executable(self, pid: int) -> tuple | None:
        """(path, build-id) of a process's executable, None when the
        process is gone (or has none: a kernel thread); the build-id read
        once per file (by device, inode, size and time): a shared machine
        starts ~300 processes a minute, mostly of a few programs, and
        opening each one's ELF cost ~200 us."""
        if not os.access(f"/proc/{pid}", os.F_OK):
            return None              # gone: most pids first counted at an interval's
                                     # end on a machine starting many short processes
                                     # (a failed readlink and its exception cost ~2x)
        exe = f"/proc/{pid}/exe"
        try:
            path = os.readlink(exe)
            st = os.stat(exe)
        except FileNotFoundError:
            return None              # gone, or a kernel thread
        except OSError:
            return "", ""
        identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        build_id = self._build_ids.get(identity)
        if build_id is None:
            from ...objfile.elf import ElfImage
            from ...model import UstackError
            try:
                build_id = ElfImage.open(exe).build_id or ""
            except (UstackError, OSError):
                build_id = ""
            if len(self._build_ids) >= self.LIMIT:
                self._build_ids.clear()
            self._build_ids[identity] = build_id
        return path, build_id


def _container(pid: int) -> str:
    """The container id docker, containerd or podman put in the cgroup
    path (64 hex digits), else ''. Read with os.read, no file object
    (~3 times cheaper: a shared machine starts hundreds of processes a
    minute, each read once)."""
    try:
        fd = os.open(f"/proc/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        data = os.read(fd, 65536)
    except OSError:
        return ""
    finally:
        os.close(fd)
    if len(data) < 64:
        return ""                    # no room for an id (most processes of a host)
    text = data.decode("utf-8", "replace")
    for part in reversed(text.replace("/", " ").replace("-", " ").replace(".", " ").split()):
        if len(part) == 64 and all(c in "0123456789abcdef" for c in part):
            return part
    return ""


class SentStacks:
    """The sink's memory of stacks: their rows' encoder; and `confirmed`
    and `confirmed_frames`, the stacks' and frames' ids the server has
    (the sender adds them), whose rows need not travel again. A Stack's
    id is kept on the object (Stack.sink_id): the symbolizer hands out
    the same object for a stack seen again, not encoded again."""

    LIMIT = 100_000                  # ids confirmed kept; past it, started afresh

    def __init__(self):
        self.rows = StackRows()
        self.confirmed: set = set()
        self.confirmed_frames: set = set()  # frames' ids, as bytes

    def stack_ids(self, stacks: list) -> tuple:
        """(each stack's id, {id: (its row, its frames' ids)} of the stacks
        whose rows were made now: those without an id yet, all at once)."""
        held = list(map(_SINK_ID, stacks))
        made: dict = {}
        if None in held:
            new = list(compress(stacks, map(operator.not_, held)))
            # each once, by identity (a Stack's own hash reads all its frames)
            new = list(dict(zip(map(id, new), new)).values())
            rows = self.rows.rows(new)
            keep_sink_ids(new, map(operator.itemgetter(0), rows))
            for sid, row, parts in rows:
                made.setdefault(sid, (row, parts))
            held = list(map(_SINK_ID, stacks))
        return held, made


def interval_batch(host: str, run_id: str, start_ns: int, duration_ns: int,
                   counts, facts: ProcessFacts, per_thread: bool,
                   known: SentStacks | None = None) -> dict:
    """One interval as it is queued and sent: its rows (the samples
    INSERT's body), and the rows (RowBinary) of the stacks they name and
    of those stacks' frames that the server is not known to have yet."""
    known = known or SentStacks()
    known.rows.next_interval()
    stacks: dict = {}
    needed: set = set()              # the ids (8 bytes) of the frames of the stacks sent
    weights: dict = {}               # (pid, tid, comm, event, stack id) -> weight
    batch = f"{host}/{run_id}/{start_ns}"
    sids, made = known.stack_ids([sc.stack for sc in counts])
    confirmed = known.confirmed
    for sc, sid in zip(counts, sids):
        if sid not in confirmed and sid not in stacks:
            # (a stack met in an earlier interval whose send is not confirmed yet)
            row, parts = made.get(sid) or known.rows.row(sc.stack)[1:]
            stacks[sid] = row
            needed.update(parts)
        key = (sc.pid, sc.tid if per_thread else 0, sc.comm, sc.event, sid)
        weights[key] = weights.get(key, 0) + sc.count
    frames = known.rows.frames_rows([sc.stack for sc in counts],
                                    needed.difference(known.confirmed_frames))
    return {"batch": batch, "host": host, "start_ns": start_ns, "frames": frames,
            "stacks": stacks, "samples": _sample_lines(
                host, batch, start_ns, duration_ns, weights, facts)}


def _sample_lines(host: str, batch: str, start_ns: int, duration_ns: int, weights: dict,
                  facts: ProcessFacts) -> bytes:
    """The samples INSERT's body (JSONEachRow), a line a row in the order
    the rows were first counted, strings escaped as json does: what the
    interval's rows share written once, a process's and event's part
    once for each (a dict a row, then each row written whole, cost ~2-3
    times this)."""
    head = (f'{{"time":{start_ns // 1_000_000_000},"start_ns":{start_ns},'
            f'"duration_ns":{duration_ns},"host":{_json(host)},"container":')
    tail = f',"batch":{_json(batch)}}}\n'
    starts: dict = {}                # (pid, tid, comm, event) -> the line up to weight
    lines = []
    for key, weight in weights.items():
        start = starts.get(key[:4])
        if start is None:
            pid, tid, comm, event = key[:4]
            exe, build_id, container = facts.of(pid)
            start = starts[key[:4]] = (
                f'{head}{_json(container)},"pid":{pid},"tid":{tid},"comm":{_json(comm)},'
                f'"executable":{_json(exe)},"build_id":{_json(build_id)},'
                f'"event":{_json(event)},"weight":')
        lines.append(f'{start}{weight},"stack_id":{key[4]}{tail}')
    return "".join(lines).encode()


def queued_interval(batch: dict) -> bytes:
    """An interval's queue file: a header line (batch, host, start, its
    stacks' and frames' ids and the bodies' lengths), then the three
    INSERT bodies as they are sent (frames and stack_frames RowBinary,
    samples JSONEachRow): the sender parses one line only."""
    return b"".join(queued_parts(batch))


def queued_parts(batch: dict) -> list:
    """queued_interval() in its parts, as the spool writes them (a whole
    machine's interval is megabytes: not copied to be joined)."""
    header, frame_rows, stacks, samples = sent_parts(batch)
    header = dict(header, frame_ids=[d.hex() for d in header["frame_ids"]],
                  frames_bytes=len(frame_rows), stacks_bytes=len(stacks),
                  samples_bytes=len(samples))
    return [json.dumps(header, separators=(",", ":")).encode() + b"\n", frame_rows, stacks,
            samples]


def sent_parts(batch: dict) -> tuple:
    """(header, frames body, stacks body, samples body) of an interval, as
    read_queued() gives them from its queue file."""
    frames = batch.get("frames", {})
    header = {"batch": batch["batch"], "host": batch["host"], "start_ns": batch["start_ns"],
              "stack_ids": list(batch["stacks"]), "frame_ids": list(frames),
              "stacks_table": STACK_FRAMES, "format": "RowBinary"}
    return (header, b"".join(frames.values()), b"".join(batch["stacks"].values()),
            batch["samples"])


# an older ustack's queue file: its stacks' rows JSONEachRow, into stacks
# itself (no table named) or stacks_in; no frames rows
_STACKS_FORMATS = {"stacks": "JSONEachRow", STACKS_IN: "JSONEachRow", STACK_FRAMES: "RowBinary"}


def read_queued(data: bytes) -> tuple:
    """(header, frames body, stacks body, samples body) of a queue file,
    the bodies views of `data` (not copies); ValueError when it is not one."""
    end = data.find(b"\n")
    if end < 0:
        raise ValueError("no header")
    header = json.loads(data[:end])
    rest = memoryview(data)[end + 1:]
    header["stacks_table"] = header.get("stacks_table", "stacks")
    if _STACKS_FORMATS.get(header["stacks_table"]) != header.get("format", "JSONEachRow"):
        raise ValueError("not a stacks table")
    header["frame_ids"] = [bytes.fromhex(i) for i in header.get("frame_ids", ())]
    cut = header.get("frames_bytes", 0)
    cut2 = cut + header["stacks_bytes"]
    if len(rest) != cut2 + header["samples_bytes"]:
        raise ValueError("truncated")
    return header, rest[:cut], rest[cut:cut2], rest[cut2:]


class ClickHouseSink:
    """Hand intervals to a sender thread, which sends them in the
    background; an interval waits on disk (the queue) when the sender
    cannot send it at once: the server down, slow, or refusing, or the run
    ending first. `close` sends what it can before the run ends and says
    what stays queued."""

    def __init__(self, server: Server, spool: Spool, host: str, per_thread: bool = False):
        self.server, self.spool, self.host = server, spool, host
        self.per_thread = per_thread
        self.run_id = secrets.token_hex(4)
        self.facts = ProcessFacts()
        self.stacks = SentStacks()
        self._named: list = []       # Frames named since last read (Symbolizer.on_named)
        self.sent = self.already_there = self.queued = self.refused = 0
        self.put_cpu_s = self.sender_cpu_s = 0.0   # what sending cost, said at the end
        self.error = ""              # the last failure, '' once sending works again
        self.errors_said: list = []   # each new failure, said once
        self._schema_made = False
        self._tried: set = set()     # queue names this run sent without an answer
        # an interval handed to the sender in memory (its queue name, its
        # batch), and the one it is sending from memory: either is written
        # to the queue as soon as a send fails, or the run ends before it
        self._lock = threading.Lock()
        self._fresh: deque = deque()
        self._in_flight = None
        self._wake = threading.Event()
        self._ending = False
        self._give_up_at = 0.0
        self._thread = threading.Thread(target=self._send_loop, name="clickhouse-sender",
                                        daemon=True)
        self._thread.start()

    # -- the sampling side: never waits for the server
    NAMED_BATCH = 256                # frames named, read together (timing each costs ~1 us)

    def named(self, frames: tuple) -> None:
        """The symbolizer's on_named: frames of a place just named, read
        a batch at a time (their CPU counted as sending's)."""
        self._named.extend(frames)
        if len(self._named) >= self.NAMED_BATCH:
            began = time.thread_time()
            self._read_named()
            self.put_cpu_s += time.thread_time() - began

    def _read_named(self) -> None:
        named, self._named = self._named, []
        if named:
            self.stacks.rows.name(named)

    def put(self, start_ns: int, duration_ns: int, counts, copied_from=None) -> None:
        """Queue an interval's counts; `copied_from`: the symbolizer's
        (Symbolizer.copied_from), which names copied Frames' originals."""
        if copied_from is not None:
            self.stacks.rows.copied_from = copied_from
        began = time.thread_time()
        try:
            self._read_named()
            self._put(start_ns, duration_ns, counts)
        finally:
            self.put_cpu_s += time.thread_time() - began

    def _put(self, start_ns: int, duration_ns: int, counts) -> None:
        batch = interval_batch(self.host, self.run_id, start_ns, duration_ns, counts,
                               self.facts, self.per_thread, self.stacks)
        if not batch["samples"]:
            return                   # nothing counted: nothing to store
        name = f"{start_ns:020d}-{self.run_id}"
        with self._lock:
            # in memory only while the sender is idle and has sent all it
            # had: an interval sent at once never touches the disk (its
            # file cost ~3-4 us a new stack to write, read and parse)
            prompt = not (self.error or self._ending or self._fresh
                          or self._in_flight or self.spool.names())
            if prompt:
                self._fresh.append((name + SUFFIX, batch))
        if not prompt:
            self.spool.put(name, queued_parts(batch))
        self.queued += 1
        self._wake.set()

    # -- the sending side
    def _send_loop(self) -> None:
        try:
            self._send_until_ended()
        finally:
            self.sender_cpu_s = time.thread_time()

    def _send_until_ended(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            self.sender_cpu_s = time.thread_time()     # this thread's, so far
            fresh = self._next_fresh()
            names = self.spool.names() if fresh is None else []
            if fresh is None and not names:
                if self._ending:
                    return
                # nothing to send until put() or close() wakes it: no
                # timeout (a wake a second, listing the queue, cost ~8 ms
                # of CPU a minute)
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                if fresh is not None:
                    self._send_fresh(*fresh)
                for name in names:
                    self._send_one(name)
                self.error, delay = "", RETRY_FIRST_S
            except (ServerError, OSError) as e:     # OSError: the queue's disk
                self.queue_fresh()   # what waited in memory waits on disk now
                if str(e) != self.error and len(self.errors_said) < 5:
                    self.errors_said.append(str(e))   # a flapping server: 5 lines at most
                self.error = str(e)
                if self._ending and self._give_up_at <= time.monotonic():
                    return
                self._wake.wait(delay)
                self._wake.clear()
                delay = min(delay * 2, RETRY_MAX_S)

    def _next_fresh(self):
        """The interval handed over in memory next, now in flight; None."""
        with self._lock:
            self._in_flight = self._fresh.popleft() if self._fresh else None
            return self._in_flight

    def _send_fresh(self, name: str, batch: dict) -> None:
        self._send(name, *sent_parts(batch))
        with self._lock:
            self._in_flight = None

    def queue_fresh(self) -> None:
        """Write the intervals held in memory (in flight or waiting) to
        the queue, for a later try or the next run: one the sender may
        have sent meanwhile is found on the server then, not sent twice
        (an interval another run queued is asked about first)."""
        with self._lock:
            held = ([self._in_flight] if self._in_flight else []) + list(self._fresh)
            self._in_flight = None
            self._fresh.clear()
            for name, batch in held:
                try:
                    self.spool.put(name[:-len(SUFFIX)], queued_parts(batch))
                except OSError as e:     # the queue's disk: lost, counted, said
                    self.spool.dropped += 1
                    if len(self.errors_said) < 5:
                        self.errors_said.append(f"--queue {self.spool.directory}: "
                                                f"{e.strerror or e}")

    def _send_one(self, name: str) -> None:
        data = self.spool.read(name)
        if data is None:
            return                   # dropped past the bound meanwhile
        try:
            batch, frames, stacks, samples = read_queued(data)
        except (ValueError, KeyError, TypeError):
            self.spool.remove(name)  # not ours to send (cannot happen: written whole)
            return
        self._send(name, batch, frames, stacks, samples)

    def _send(self, name: str, batch: dict, frames, stacks, samples) -> None:
        """Send one interval (its header and bodies, from its queue file or
        from memory) and remove its queue file, if it has one: its
        requests, one after the other, over one connection."""
        with self.server.kept_alive():
            self._send_requests(name, batch, frames, stacks, samples)

    def _send_requests(self, name: str, batch: dict, frames, stacks, samples) -> None:
        if not self._schema_made:
            for statement in create_statements(self.server.database):
                self.server.query(statement)
            # a server that answers anything to anything is not taken for one:
            # the inserts' answers (empty) prove nothing
            self.server.rows("SELECT version()")
            self._schema_made = True
        # an interval this run queued and never tried cannot be on the
        # server: it goes in with no question asked (one request fewer)
        unsure = name in self._tried or not name.endswith(f"-{self.run_id}{SUFFIX}")
        self._tried.add(name)
        try:
            missing = self._missing(batch) if unsure else None
            if missing == []:
                self.already_there += 1
            else:
                # none when the server has them all already; frames before
                # the stacks naming them, stacks before the samples
                db, fmt = self.server.database, batch.get("format", "JSONEachRow")
                if frames:
                    self.server.query(f"INSERT INTO {db}.{FRAMES} FORMAT RowBinary", frames)
                if stacks:
                    self.server.query(f"INSERT INTO {db}.{batch['stacks_table']} "
                                      f"FORMAT {fmt}", stacks)
                self._insert(batch, samples, missing)
                self.sent += 1
        except ServerError as e:
            if e.status != 400:
                raise
            # the server refuses these rows (400: a bad value), and would
            # refuse them every time: dropped, counted, said, so that one
            # interval does not hold up all that follow it
            self.refused += 1
            if len(self.errors_said) < 5:
                self.errors_said.append(f"{e} (an interval refused, dropped)")
            self._done(name)
            return
        # the server has these stacks now: later intervals name them only
        for confirmed, ids in ((self.stacks.confirmed, batch["stack_ids"]),
                               (self.stacks.confirmed_frames, batch["frame_ids"])):
            if len(confirmed) > SentStacks.LIMIT:
                confirmed.clear()    # bounded: a stack or frame then travels once more
            confirmed.update(ids)
        self._done(name)

    def _done(self, name: str) -> None:
        self.spool.remove(name)
        self._tried.discard(name)

    def _insert(self, batch: dict, samples: bytes, missing: list | None) -> None:
        """The interval's three parts (missing None: all of them, through
        samples_in's views), or those `missing` names, each straight into
        its table: samples first, the sums then summed from them."""
        db = self.server.database
        if missing is None:
            self.server.query(f"INSERT INTO {db}.samples_in FORMAT JSONEachRow", samples)
            return
        if "samples" in missing:
            self.server.query(f"INSERT INTO {db}.samples FORMAT JSONEachRow", samples)
        for sums in SUMS:
            if sums.table in missing:
                self.server.query(f"INSERT INTO {db}.{sums.table} "
                                  + sums_select(db, sums, "samples", _of_batch(batch)))

    def _missing(self, batch: dict) -> list | None:
        """The tables whose part of this interval the server lacks; None
        when it has none of them (sent as the first time)."""
        db, second = self.server.database, batch["start_ns"] // 10**9
        tables = ["samples"] + [sums.table for sums in SUMS]
        counts = [f"(SELECT count() FROM {db}.samples WHERE {_of_batch(batch)})"] + [
            f"(SELECT count() FROM {db}.{sums.table} WHERE start = "
            f"{sums.start_of}(toDateTime({second})) AND event = {quote(MARKER_EVENT)} "
            f"AND comm = {quote(batch['batch'])})" for sums in SUMS]
        rows = self.server.rows(f"SELECT {', '.join(counts)}")
        try:
            has = [int(n) > 0 for n in rows[0]]
        except (IndexError, ValueError, TypeError):
            raise ServerError(f"{self.server.address}: the answer is not a count: "
                              f"{rows!r:.60}") from None
        if len(has) != len(tables):
            raise ServerError(f"{self.server.address}: the answer is not a count: "
                              f"{rows!r:.60}")
        return None if not any(has) else [t for t, there in zip(tables, has) if not there]

    def close(self, wait_s: float = 1.0) -> int:
        """End the sender: keep sending while it succeeds (at most `wait_s`:
        a run stops within a second; what is left is sent by the next),
        give up at the first failure past the run's end. Returns how many
        intervals stay queued for the next run."""
        self._give_up_at = time.monotonic()
        self._ending = True
        self._wake.set()
        self._thread.join(wait_s)
        self.queue_fresh()           # not sent yet: on disk for the next run
        left = len(self.spool.names())
        return left

    def close_and_say(self, err) -> None:
        """close(), then one line on what reached the server and what did not."""
        left = self.close()
        for said in self.errors_said:
            print(f"ustack: {said}", file=err)
        if self.spool.dropped:
            print(f"ustack: {self.spool.dropped} intervals dropped from the queue "
                  f"{self.spool.directory} (over its {_size(self.spool.limit)})",
                  file=err)
        print(f"Sent {self.sent} intervals to {self.server.address}"
              + (f" ({self.already_there} it had already)" if self.already_there else "")
              + (f", {self.refused} refused by it" if self.refused else "")
              + f", {self.put_cpu_s + self.sender_cpu_s:.3f} s of CPU"
              + (f"; {left} stay queued in {self.spool.directory} for the next run "
                 "with --to" if left else ""), file=err)
        self.spool.close()


def _of_batch(batch: dict) -> str:
    """The samples rows of one interval (host and time first: the sort key)."""
    return (f"samples.host = {quote(batch['host'])} AND samples.time = "
            f"toDateTime({batch['start_ns'] // 10**9}) AND samples.batch = "
            f"{quote(batch['batch'])}")


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:.4g} KiB"
