"""The tables ustack keeps in ClickHouse (docs/clickhouse.md says why
these engines and keys), created when missing, in the syntax 18.16 takes:

samples  a row per (interval, process[, thread], event, stack): the
         counted weight; sorted by host then time, so a host's or a time
         range's flame graph reads only its granules.
stack_frames, frames  each distinct stack once, by its id (a hash of
         its frames' ids): its frames' ids, and each distinct frame once,
         by its id (a hash of its names): ReplacingMergeTrees, so the same
         stack or frame sent by fifty hosts, or twice by a retry, merges
         into one row. A stack travels as ~8 bytes a frame, its frames'
         names once per run (report --from joins them).
stacks   the stacks of an older ustack, each with its frames' names
         (arrays), by the same ids; read beside stack_frames.
sums_daily, sums_hourly  the samples summed per day (hour), event, comm
         and stack: a query over all hosts reads the whole days and hours
         of its range there (10 M rows -> 0.7 M hourly, 75,000 daily, in
         bench/clickhouse.py's table), those whose count of rows it
         proves equal to the samples' (clickhouse_source.py).
stacks_in  where an older agent inserts stacks: a Null table whose view
         (stacks_feed) splits a row's one string of frames into the stacks
         table's columns.
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
import struct
from collections import deque
from itertools import chain, compress, repeat
from typing import NamedTuple

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
STACKS_IN = "stacks_in"             # where an older ustack's queued stacks go
FRAMES, STACK_FRAMES = "frames", "stack_frames"
# Between a frame's fields and between frames in stacks_in.frames (names
# ustack keeps are printable: neither separator can be in one)
FIELD_SEP, FRAME_SEP = "\x1f", "\x1e"
STACKS_COLUMNS = (
    "stack_id UInt64, function Array(String), module Array(String), "
    "file Array(String), line Array(UInt32), language Array(String), "
    "inlined Array(UInt8), notes Array(String)")
FRAMES_COLUMNS = ("frame_id UInt64, function String, module String, file String, "
                  "line UInt32, language String, inlined UInt8")
STACK_FRAMES_COLUMNS = "stack_id UInt64, frame_ids Array(UInt64), notes Array(String)"


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
        f"CREATE TABLE IF NOT EXISTS {database}.{FRAMES} ({FRAMES_COLUMNS}) "
        "ENGINE = ReplacingMergeTree() ORDER BY frame_id",
        f"CREATE TABLE IF NOT EXISTS {database}.{STACK_FRAMES} ({STACK_FRAMES_COLUMNS}) "
        "ENGINE = ReplacingMergeTree() ORDER BY stack_id",
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


# What of a frame goes into its row (and so into its id).
_FRAME_FIELDS = operator.attrgetter("function", "module", "file", "line", "kind",
                                    "inlined", "objaddr", "objstart")
_UINT32 = struct.Struct("<I").pack
_FRAMES_OF = operator.attrgetter("frames")
_SINK_ID = operator.attrgetter("sink_id")


class _NoOriginal:
    """What copied_from gives for a Frame that copies none."""
    sink_id = None


_NO_ORIGINAL = _NoOriginal()


def keep_sink_ids(objects, ids) -> None:
    """Each Frame's or Stack's sink_id kept on the object (not a field:
    its equality and hash stay its fields'), C-level maps."""
    deque(map(operator.setitem, map(vars, objects), repeat("sink_id"), ids), maxlen=0)


class StackRows:
    """The rows a stack travels as (RowBinary, the server's own binary
    layout): its stack_frames row, the stack's id and its frames' ids, and
    a frames row for each distinct frame, made once per run. A frame's id
    is the 64-bit BLAKE2b of what names it (FIELD_SEP between its fields),
    and a stack's id the BLAKE2b of its frames' ids and notes: the same
    ids as when whole stacks travelled, so a stack is one row however many
    hosts, and agents old or new, send it. A stack's row is its id, its
    frames' ids (the hashed bytes themselves: RowBinary's UInt64s) and its
    notes, 8 bytes a frame instead of ~100 of text.

    A frame's id, once known, is kept on the Frame itself (Frame.sink_id):
    the symbolizer hands out one Frame for a place in a mapped file
    (Symbolizer.frames), and a copy of it for the same place in another
    process of the program carries the attribute with it, so most frames
    of a new stack are read by one attribute lookup, no map. A Frame
    without one may be a copy made before its original's id was known
    (`copied_from`: Symbolizer.copied_from): it takes its original's.
    Else its fields are read once (~2.5 us live, scattered in memory).
    Each stack's row is then C-level maps and joins, no Python step per
    frame."""

    FRAMES_LIMIT = 200_000           # frames rows and contents kept; past it,
                                     # started afresh at the next interval

    def __init__(self):
        self._frames: dict = {}      # a frame's content -> its id (8 bytes)
        self.frame_rows: dict = {}   # a frame's id (8 bytes) -> its frames row
        self._texts: dict = {}       # (module, file) or (kind, inlined) -> their parts
        self.copied_from: dict = {}  # id(a copied Frame) -> its original (the symbolizer's)

    def next_interval(self) -> None:
        """Bound the memory between intervals (within one, every frame id
        a row names keeps its frames row; a row dropped is made again from
        its Frame when it must travel: frames_rows)."""
        if len(self._frames) >= self.FRAMES_LIMIT or len(self.frame_rows) >= self.FRAMES_LIMIT:
            self._frames.clear()
            self.frame_rows.clear()

    def frames_rows(self, stacks, ids) -> dict:
        """{id: frames row} of these frame ids (8 bytes), named by the
        frames of `stacks`: each kept row, else made again from a Frame
        that has the id (its row was dropped past the bound)."""
        rows = self.frame_rows
        out = {digest: rows.get(digest) for digest in ids}
        if None in out.values():
            for frame in chain.from_iterable(map(_FRAMES_OF, stacks)):
                if out.get(frame.sink_id, b"") is None:
                    out[frame.sink_id] = rows.get(frame.sink_id) or \
                        rows[self._frame(_FRAME_FIELDS(frame), frame)]
        return out

    def row(self, stack: Stack) -> tuple:
        """(stack id, its stack_frames row, its frames' ids (8 bytes
        each)): the frames innermost first, by function (as the flame
        graphs merge them)."""
        return self.rows([stack])[0]

    def rows(self, stacks: list) -> list:
        """row() of each stack, all at once: an interval's new stacks name
        ~40 frames each, mostly Frames met before, and each step costs
        ~100-200 ns on a loaded machine: so every frame of every stack is
        looked up in one C-level pass and each stack's row joined; only a
        stack naming a Frame without an id yet (its join fails) has its
        frames gone through again, after those Frames are resolved, once
        each however many stacks name them (passes over every frame to
        find them cost ~5 us a new stack live)."""
        frames_of = list(map(_FRAMES_OF, stacks))
        parts = list(map(_SINK_ID, chain.from_iterable(frames_of)))
        out = []
        unmet = []                   # (index in out, its frames' ids so far)
        at = 0
        for stack, frames in zip(stacks, frames_of):
            n = len(frames)
            mine = parts[at:at + n]
            at += n
            try:
                out.append(_stack_row(stack, n, b"".join(mine), mine))
            except TypeError:        # a None among them: a Frame without an id
                unmet.append((len(out), mine))
                out.append(None)
        if unmet:
            new = list(chain.from_iterable(
                compress(frames_of[i], map(operator.not_, mine)) for i, mine in unmet))
            self._met(list(dict(zip(map(id, new), new)).values()))   # each once
            for i, _mine in unmet:
                frames = frames_of[i]
                mine = list(map(_SINK_ID, frames))
                out[i] = _stack_row(stacks[i], len(frames), b"".join(mine), mine)
        return out

    def name(self, frames: list) -> None:
        """Each of `frames` (no copies among them) keeps the id of its
        content, its row made the first time a content is met. Asked of
        Frames just named, while their memory is warm (~2-3 times cheaper
        than at the interval's end; the copies made of them later carry
        the id), and of those an interval meets without one (_met)."""
        keys = list(map(_FRAME_FIELDS, frames))
        read = list(map(self._frames.get, keys))
        if None in read:             # a frame never met by content: its row made
            read = [p or self._frames.get(k) or self._frame(k, f)
                    for p, k, f in zip(read, keys, frames)]
        keep_sink_ids(frames, read)

    def _met(self, new: list) -> None:
        """Learn the ids of Frames that have none yet (each once): a copy
        takes its original's (the original new too, as in a run's first
        interval, where every copy's is: after it), any other is read by
        content (its fields once: ~1 us a frame, scattered in memory, ~2.5
        us live); each keeps its id. C-level maps but for one step per
        Frame read."""
        originals = list(map(self.copied_from.get, map(id, new), repeat(_NO_ORIGINAL)))
        found = list(map(_SINK_ID, originals))
        if None not in found:
            keep_sink_ids(new, found)
            return
        # a copy whose original is new here too: after its original
        wait = set(map(id, new)).intersection(map(id, originals))
        unread = [f for f, p, o in zip(new, found, originals) if not (p or id(o) in wait)]
        self.name(unread)
        # the copies: their originals' (known now)
        copies = list(compress(new, map(operator.not_, map(_SINK_ID, new))))
        keep_sink_ids(copies, map(_SINK_ID, map(self.copied_from.__getitem__, map(id, copies))))

    def _frame(self, key: tuple, frame: Frame) -> bytes:
        """A frame's id (the hash of what names it: its fields' UTF-8,
        FIELD_SEP between them), its frames row kept. Module and file,
        language and inlined repeat from frame to frame: their parts of
        the hashed text and of the row are made once each (~1 us less a
        frame content, ~2 of which a new stack meets)."""
        function, module, file, line, kind, inlined = key[:6]
        data = (function or unnamed_function(frame) or "[unknown]").encode(
            "utf-8", "backslashreplace")
        line = (line if line <= 0xFFFFFFFF else 0xFFFFFFFF) if line > 0 else 0  # UInt32
        where = self._texts.get((module, file)) or self._where(module, file)
        what = self._texts.get((kind, inlined)) or self._what(kind, inlined)
        digest = self._frames[key] = hashlib.blake2b(
            b"".join((data, where[0], b"%d" % line, what[0])), digest_size=8).digest()
        n = len(data)
        self.frame_rows[digest] = b"".join((
            digest, bytes((n,)) if n < 0x80 else _varint(n), data, where[1], _UINT32(line),
            what[1]))
        return digest

    def _where(self, module: str, file: str) -> tuple:
        """(what the hashed text has from the function to the line, what
        the row has from the function to the line) of a module and file."""
        module_utf8, file_utf8 = _utf8(module), _utf8(file)
        return self._keep((module, file), (
            b"\x1f%b\x1f%b\x1f" % (module_utf8, file_utf8),
            _varint(len(module_utf8)) + module_utf8 + _varint(len(file_utf8)) + file_utf8))

    def _what(self, kind: str, inlined: bool) -> tuple:
        """(the hashed text's end, the row's end) after the line: the
        language and inlined."""
        language = _utf8(kind or "native")
        return self._keep((kind, inlined), (
            b"\x1f%b\x1f%b" % (language, b"1" if inlined else b"0"),
            _varint(len(language)) + language + (b"\x01" if inlined else b"\x00")))

    def _keep(self, key: tuple, parts: tuple) -> tuple:
        if len(self._texts) >= self.FRAMES_LIMIT:
            self._texts.clear()
        self._texts[key] = parts
        return parts


def _stack_row(stack: Stack, n: int, frame_ids: bytes, parts: list) -> tuple:
    """StackRows.row() of a stack of n frames whose ids, joined, are
    `frame_ids` (`parts` apart)."""
    notes = stack.notes
    if notes:
        named = hashlib.blake2b(frame_ids + FIELD_SEP.join(notes).encode(),
                                digest_size=8).digest()
        tail = _varint(len(notes)) + b"".join(map(_string, notes))
    else:
        named, tail = hashlib.blake2b(frame_ids, digest_size=8).digest(), b"\x00"
    count = bytes((n,)) if n < 0x80 else _varint(n)
    return (int.from_bytes(named, "little"), b"".join((named, count, frame_ids, tail)), parts)


def _varint(n: int) -> bytes:
    """RowBinary's length: LEB128."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _utf8(text: str) -> bytes:
    """A name's UTF-8 (one that is not valid UTF-8 text keeps its bad
    code points as escapes)."""
    return text.encode("utf-8", "backslashreplace")


def _string(text: str) -> bytes:
    """A String in RowBinary: its length, then its UTF-8."""
    data = _utf8(text)
    return _varint(len(data)) + data

