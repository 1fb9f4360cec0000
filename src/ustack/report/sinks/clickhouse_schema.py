"""The tables ustack keeps in ClickHouse (docs/clickhouse.md says why
these engines and keys), created when missing, in the syntax 18.16 takes:

samples  a row per (interval, process[, thread], event, stack): the
         counted weight; sorted by host then time, so a host's or a time
         range's flame graph reads only its granules.
stacks   each distinct stack once, by its id (a hash of its frames):
         ReplacingMergeTree, so the same stack sent by fifty hosts, or
         twice by a retry, merges into one row.
sums_daily, sums_hourly  the samples summed per day (hour), event, comm
         and stack: a query over all hosts reads the whole days and hours
         of its range there (10 M rows -> 0.7 M hourly, 75,000 daily, in
         bench/clickhouse.py's table), those whose count of rows it
         proves equal to the samples' (clickhouse_source.py).
stacks_in  where the agent inserts stacks: a Null table whose view
         (stacks_feed) splits a row's one string of frames into the stacks
         table's columns, so the agent joins one string a stack, not six
         arrays.
samples_in  where an interval is inserted: a Null table whose three
         views write its rows to samples and its sums to the two tables
         above, each a part of its own. A server killed mid-insert may
         keep any of the three parts and lose the others, so each part
         says which interval it holds (samples: the batch column; a sums
         part: one marker row, event '' and the batch as its comm) and
         the sender, when unsure, fills in exactly the parts missing,
         straight into their tables (no view fires there twice)."""
from __future__ import annotations

import hashlib
import operator
from itertools import compress
from typing import NamedTuple
from json.encoder import encode_basestring_ascii as _json   # json.dumps of a str, in C

from ...model import Frame, Stack, unnamed_function

SAMPLES_COLUMNS = (
    "time DateTime, start_ns UInt64, duration_ns UInt64, host String, "
    "container String, pid UInt32, tid UInt32, comm String, executable String, "
    "build_id String, event String, weight UInt64, stack_id UInt64, batch String")
# rows: the samples rows summed, the proof of a period; batches: 1 on an
# interval's marker row (0 elsewhere), which keeps the marker through the
# SummingMergeTree's merges (a row summing to zeros is dropped)
SUMS_COLUMNS = ("start DateTime, event String, comm String, stack_id UInt64, weight UInt64, "
                "rows UInt64, batches UInt64")
MARKER_EVENT = ""                # no counted event is named ''
# the views of the sums tables before these names (they read samples
# itself): an insert into samples_in reaches samples through a view, which
# would fire them too, so they are dropped
OLD_VIEWS = ("samples_daily_feed", "samples_hourly_feed")


class Sums(NamedTuple):
    """A table of the samples summed per period (its start), event, comm
    and stack, which a materialized view of samples_in fills on every
    insert."""
    table: str
    start_of: str                    # ClickHouse's function: a time -> its period's start
    seconds: int
    partition: str


# coarsest first: a query takes the whole days it can, then the whole hours
SUMS = (Sums("sums_daily", "toStartOfDay", 86_400, "toYYYYMM(start)"),
        Sums("sums_hourly", "toStartOfHour", 3_600, "toDate(start)"))
STACKS_IN = "stacks_in"
# Between a frame's fields and between frames in stacks_in.frames (names
# ustack keeps are printable: neither separator can be in one)
FIELD_SEP, FRAME_SEP = "\x1f", "\x1e"
STACKS_COLUMNS = (
    "stack_id UInt64, function Array(String), module Array(String), "
    "file Array(String), line Array(UInt32), language Array(String), "
    "inlined Array(UInt8), notes Array(String)")


def create_statements(database: str) -> list:
    samples_in = f"{database}.samples_in"
    return [
        f"CREATE DATABASE IF NOT EXISTS {database}",
        f"CREATE TABLE IF NOT EXISTS {database}.samples ({SAMPLES_COLUMNS}) "
        "ENGINE = MergeTree() PARTITION BY toDate(time) "
        "ORDER BY (host, time, comm, stack_id)",
        f"CREATE TABLE IF NOT EXISTS {database}.stacks ({STACKS_COLUMNS}) "
        "ENGINE = ReplacingMergeTree() ORDER BY stack_id",
        f"CREATE TABLE IF NOT EXISTS {database}.{STACKS_IN} "
        "(stack_id UInt64, frames String, notes Array(String)) ENGINE = Null",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.stacks_feed TO {database}.stacks "
        f"AS {_stacks_select(database)}",
    ] + [f"DROP TABLE IF EXISTS {database}.{view}" for view in OLD_VIEWS] + [
        f"CREATE TABLE IF NOT EXISTS {samples_in} ({SAMPLES_COLUMNS}) ENGINE = Null",
    ] + [statement for sums in SUMS for statement in (
            # the views before any agent's first insert into a new database;
            # an older database's periods before them answer from samples
            f"CREATE TABLE IF NOT EXISTS {database}.{sums.table} ({SUMS_COLUMNS}) "
            f"ENGINE = SummingMergeTree((weight, rows, batches)) "
            f"PARTITION BY {sums.partition} ORDER BY (start, event, comm, stack_id)",
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{sums.table}_feed "
            f"TO {database}.{sums.table} AS {sums_select(database, sums, 'samples_in')}")
    ] + [  # samples' own view the last: an insert reaching samples reaches the sums
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.samples_feed "
        f"TO {database}.samples AS SELECT * FROM {samples_in}"]


def _stacks_select(database: str) -> str:
    """stacks_in's rows as the stacks table's: its frames string split
    (FRAME_SEP between frames, FIELD_SEP between a frame's fields) into
    the columns, as the agent's StackRows joined them. Written out in each
    column: 18.16 finds no alias of a subquery inside a view."""
    source = f"{database}.{STACKS_IN}"
    fields = (f"arrayMap(x -> splitByChar('{FIELD_SEP}', x), arrayFilter(x -> x != '', "
              f"splitByChar('{FRAME_SEP}', {source}.frames)))")
    columns = ", ".join(
        f"arrayMap(y -> {cast.format(f'y[{i}]')}, {fields}) AS {name}"
        for i, (name, cast) in enumerate((
            ("function", "{}"), ("module", "{}"), ("file", "{}"), ("line", "toUInt32({})"),
            ("language", "{}"), ("inlined", "toUInt8({})")), 1))
    return (f"SELECT {source}.stack_id AS stack_id, {columns}, {source}.notes AS notes "
            f"FROM {source}")


def sums_select(database: str, sums: Sums, source: str, where: str = "1") -> str:
    """The rows of `source` summed as `sums` keeps them, and one marker
    row per batch (ARRAY JOIN [0, 1]: each row once as itself, once as its
    batch's marker), so that the sums of an interval and its marker are
    one part: a view's query (source samples_in), and the sender's when it
    fills in a part the server lost (source samples, `where` its batch).
    Columns are named through their table: 18.16 takes `event AS event`
    for a cycle of aliases."""
    def col(name: str) -> str:
        return f"{source}.{name}"
    return (f"SELECT {sums.start_of}({col('time')}) AS start, "
            f"if(marker = 1, '{MARKER_EVENT}', {col('event')}) AS event, "
            f"if(marker = 1, {col('batch')}, {col('comm')}) AS comm, "
            f"if(marker = 1, toUInt64(0), {col('stack_id')}) AS stack_id, "
            f"sum(if(marker = 1, toUInt64(0), {col('weight')})) AS weight, "
            "sum(toUInt64(1 - marker)) AS rows, toUInt64(marker) AS batches "
            f"FROM {database}.{source} ARRAY JOIN [0, 1] AS marker WHERE {where} "
            "GROUP BY start, marker, event, comm, stack_id")


# What of a frame goes into its stacks row (and so into its id).
_FRAME_FIELDS = operator.attrgetter("function", "module", "file", "line", "kind",
                                    "inlined", "objaddr", "objstart")
_FRAME_SEP_JSON = _json(FRAME_SEP)[1:-1]
_TEXT, _DIGEST = operator.itemgetter(0), operator.itemgetter(1)


class StackRows:
    """stacks_in rows as the INSERT sends them (JSONEachRow lines), with
    their ids. A row carries its frames as one string, each frame's fields
    joined by FIELD_SEP, and the server splits it into the stacks table's
    columns (stacks_feed): each distinct frame's JSON text (and its hash)
    is made once, and a stack's row is one join of them. A whole-machine
    profile meets thousands of stacks it has not seen a minute, but few new
    frames (one minute of a shared machine: 55,239 frames in 1,680 new
    stacks, 4,179 distinct).

    A frame is found by its identity first: the symbolizer hands out one
    Frame for a place in a mapped file (Symbolizer.frames), so most frames
    of a new stack are Frames met before, and looking one up by id() does
    not read the Frame at all (reading a frame's fields was most of a
    stack's cost: scattered Frames' memory). Else by its content, read once
    per Frame. Each stack's row is then C-level maps and joins, no Python
    step per frame."""

    FRAMES_LIMIT = 200_000           # frames kept, by content and by identity; past it,
                                     # started afresh

    def __init__(self):
        self._frames: dict = {}      # a frame's content -> (JSON text, hash)
        self._by_id: dict = {}       # id(Frame) -> (JSON text, hash)
        self._held: list = []        # those Frames (held: an id stays its Frame's)

    def row(self, stack: Stack) -> tuple:
        """(stack id, its stacks_in row's JSON line): the frames innermost
        first, by function (as the flame graphs merge them)."""
        frames = stack.frames
        ids = list(map(id, frames))
        parts = list(map(self._by_id.get, ids))
        if None in parts:
            parts = self._met(frames, ids, parts)
        notes = stack.notes
        sid = _hash(b"".join(map(_DIGEST, parts)) + FIELD_SEP.join(notes).encode())
        line = "".join(('{"stack_id":', str(sid), ',"frames":"',
                        _FRAME_SEP_JSON.join(map(_TEXT, parts)),
                        '","notes":[', ",".join(map(_json, notes)), "]}\n"))
        return sid, line

    def _met(self, frames: tuple, ids: list, parts: list) -> list:
        """The parts of a stack with Frames not met before: those Frames'
        by content (their fields read once: ~1 us a frame, scattered in
        memory), then kept by identity; C-level maps, no Python step per
        frame."""
        by_id, held = self._by_id, self._held
        if len(held) >= self.FRAMES_LIMIT:
            by_id.clear()
            held.clear()
            parts = [None] * len(frames)     # all of this stack's met again
        new = list(compress(frames, map(operator.not_, parts)))
        keys = list(map(_FRAME_FIELDS, new))
        found = list(map(self._frames.get, keys))
        if None in found:            # a frame never met by content: its text made
            found = [p or self._frame(k, f) for p, k, f in zip(found, keys, new)]
        by_id.update(zip(map(id, new), found))
        held.extend(new)
        if len(new) == len(frames):  # a process's first stack: all its Frames new
            return found
        fill = iter(found)
        return [p or next(fill) for p in parts]

    def _frame(self, key: tuple, frame: Frame) -> tuple:
        """A frame's fields as JSON text, and the hash of what names it."""
        if len(self._frames) >= self.FRAMES_LIMIT:
            self._frames.clear()
        function = frame.function or unnamed_function(frame) or "[unknown]"
        line = str(frame.line if frame.line > 0 else 0)    # UInt32: unknown is 0
        named = FIELD_SEP.join((function, frame.module, frame.file, line,
                                frame.kind or "native", "1" if frame.inlined else "0"))
        parts = self._frames[key] = (_json(named)[1:-1],
                                     hashlib.blake2b(named.encode(), digest_size=8).digest())
        return parts


def _hash(data: bytes) -> int:
    """A stack's id: a 64-bit hash of its frames' hashes and its notes, the
    same on every host, so one stack is stored once however many send it."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
