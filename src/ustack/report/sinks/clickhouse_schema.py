"""The two tables ustack keeps in ClickHouse (docs/clickhouse.md says why
these engines and keys), created when missing, in the syntax 18.16 takes:

samples  a row per (interval, process[, thread], event, stack): the
         counted weight; sorted by host then time, so a host's or a time
         range's flame graph reads only its granules.
stacks   each distinct stack once, by its id (a hash of its frames):
         ReplacingMergeTree, so the same stack sent by fifty hosts, or
         twice by a retry, merges into one row.
samples_hourly  the samples summed per hour, event, comm and stack (a
         materialized view feeds it on every insert): a query over all
         hosts reads ~1/17 of the rows (10 M -> 0.6 M measured), for the
         hours whose totals it proves equal to the samples'
         (clickhouse_source.py)."""
from __future__ import annotations

import hashlib
import operator
from json.encoder import encode_basestring_ascii as _json   # json.dumps of a str, in C

from ...model import Frame, Stack, unnamed_function

SAMPLES_COLUMNS = (
    "time DateTime, start_ns UInt64, duration_ns UInt64, host String, "
    "container String, pid UInt32, tid UInt32, comm String, executable String, "
    "build_id String, event String, weight UInt64, stack_id UInt64, batch String")
HOURLY = "samples_hourly"
HOURLY_COLUMNS = "hour DateTime, event String, comm String, stack_id UInt64, weight UInt64"
STACKS_COLUMNS = (
    "stack_id UInt64, function Array(String), module Array(String), "
    "file Array(String), line Array(UInt32), language Array(String), "
    "inlined Array(UInt8), notes Array(String)")


def create_statements(database: str) -> list:
    return [
        f"CREATE DATABASE IF NOT EXISTS {database}",
        f"CREATE TABLE IF NOT EXISTS {database}.samples ({SAMPLES_COLUMNS}) "
        "ENGINE = MergeTree() PARTITION BY toDate(time) "
        "ORDER BY (host, time, comm, stack_id)",
        f"CREATE TABLE IF NOT EXISTS {database}.stacks ({STACKS_COLUMNS}) "
        "ENGINE = ReplacingMergeTree() ORDER BY stack_id",
        # the view before any agent's first insert into a new database; an
        # older database's hours before it answer from samples
        f"CREATE TABLE IF NOT EXISTS {database}.{HOURLY} ({HOURLY_COLUMNS}) "
        "ENGINE = SummingMergeTree(weight) PARTITION BY toDate(hour) "
        "ORDER BY (hour, event, comm, stack_id)",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{HOURLY}_feed "
        f"TO {database}.{HOURLY} AS {hourly_select(database)}",
    ]


def hourly_select(database: str, where: str = "1") -> str:
    """The samples summed as samples_hourly keeps them: the view's query,
    and a backfill's (INSERT INTO samples_hourly SELECT … WHERE the hours
    before the view)."""
    return ("SELECT toStartOfHour(time) AS hour, event, comm, stack_id, "
            f"sum(weight) AS weight FROM {database}.samples WHERE {where} "
            "GROUP BY hour, event, comm, stack_id")


# What of a frame goes into its stacks row (and so into its id).
_FRAME_FIELDS = operator.attrgetter("function", "module", "file", "line", "kind",
                                    "inlined", "objaddr", "objstart")


class StackRows:
    """Stacks rows as the INSERT sends them (JSONEachRow lines), with
    their ids. Each distinct frame's texts (and its own hash) are made once
    and a stack's row is joined from them: a whole-machine profile meets
    thousands of stacks it has not seen a minute, but few new frames (one
    minute of a shared machine: 4,277 new stacks of 147,658 frames, 5,401
    of them distinct), and encoding each frame afresh cost ~100 us a stack,
    against ~35 us so."""

    FRAMES_LIMIT = 200_000           # frames kept; past it, started afresh

    def __init__(self):
        self._frames: dict = {}

    def row(self, stack: Stack) -> tuple:
        """(stack id, its row's JSON line): the frames innermost first, by
        function (as the flame graphs merge them)."""
        get = self._frames.get
        parts = [get(key) or self._frame(key, f)
                 for f, key in zip(stack.frames, map(_FRAME_FIELDS, stack.frames))]
        functions, modules, files, lines, languages, inlined, hashes = (
            zip(*parts) if parts else ((),) * 7)
        notes = stack.notes
        sid = _hash(b"".join(hashes) + "\x1f".join(notes).encode())
        line = "".join((
            '{"function":[', ",".join(functions), '],"module":[', ",".join(modules),
            '],"file":[', ",".join(files), '],"line":[', ",".join(lines),
            '],"language":[', ",".join(languages), '],"inlined":[', ",".join(inlined),
            '],"notes":[', ",".join(map(_json, notes)), '],"stack_id":', str(sid), "}\n"))
        return sid, line

    def _frame(self, key: tuple, frame: Frame) -> tuple:
        """A frame's columns as JSON, and the hash of what names it."""
        if len(self._frames) >= self.FRAMES_LIMIT:
            self._frames.clear()
        function = frame.function or unnamed_function(frame) or "[unknown]"
        line = str(frame.line if frame.line > 0 else 0)    # UInt32: unknown is 0
        language = frame.kind or "native"
        inlined = "1" if frame.inlined else "0"
        # (unit and record separators cannot be in a name ustack keeps:
        # names are printable)
        named = "\x1f".join((function, frame.module, frame.file, line, language, inlined))
        parts = self._frames[key] = (
            _json(function), _json(frame.module), _json(frame.file), line, _json(language),
            inlined, hashlib.blake2b(named.encode(), digest_size=8).digest())
        return parts


def _hash(data: bytes) -> int:
    """A stack's id: a 64-bit hash of its frames' hashes and its notes, the
    same on every host, so one stack is stored once however many send it."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
