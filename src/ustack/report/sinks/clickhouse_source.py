"""`ustack report --from clickhouse://HOST:PORT/DB`: the counted stacks
`--every --to` sent, summed over the hosts, processes and time the
filters keep, as the StackCounts every counted format takes."""
from __future__ import annotations

from ...model import Frame, Stack, StackCount, UstackError
from .clickhouse_http import Server, ServerError, quote
from .clickhouse_schema import FRAMES, STACK_FRAMES, SUMS
from .filters import Filter


def where(f: Filter) -> str:
    conds = ["1"]
    if f.hosts:
        conds.append(f"host IN ({', '.join(map(quote, f.hosts))})")
    if f.comms:
        conds.append(f"comm IN ({', '.join(map(quote, f.comms))})")
    if f.pids:
        conds.append(f"pid IN ({', '.join(str(int(p)) for p in f.pids)})")
    if f.containers:
        conds.append("(" + " OR ".join(f"substring(container, 1, {len(c)}) = {quote(c)}"
                                       for c in f.containers) + ")")
    if f.event:
        conds.append(f"event = {quote(f.event)}")
    if f.since_ns is not None:          # time first: the sort key's granules
        conds.append(f"time >= toDateTime({f.since_ns // 10**9}) "
                     f"AND start_ns >= {f.since_ns}")
    if f.until_ns is not None:
        conds.append(f"time <= toDateTime({f.until_ns // 10**9}) "
                     f"AND start_ns < {f.until_ns}")
    return " AND ".join(conds)


def counted_stacks(server: Server, f: Filter, per_pid: bool = False) -> list:
    """The StackCounts the filter keeps: summed per stack and event (and
    per host process with `per_pid`)."""
    db = server.database
    cond = where(f)
    keys = "stack_id, event, comm" + (", pid" if per_pid else "")   # comm: folded's root
    try:
        plan = (None if per_pid or f.hosts or f.pids or f.containers
                else sums_plan(server, f))
        if plan:
            parts, rest = plan
            kept = where(Filter(comms=f.comms, event=f.event))
            sql = " UNION ALL ".join(
                f"SELECT {keys}, weight AS w FROM {db}.{sums.table} "
                f"WHERE toUInt32(start) IN ({_listed(starts)}) AND batches = 0 AND {kept}"
                for sums, starts in parts)
            if rest:
                sql += (f" UNION ALL SELECT {keys}, weight AS w FROM {db}.samples "
                        f"WHERE {cond} AND ({rest})")
            sql = f"SELECT {keys}, sum(w) FROM ({sql}) GROUP BY {keys}"
        else:
            sql = f"SELECT {keys}, sum(weight) FROM {db}.samples WHERE {cond} GROUP BY {keys}"
        counted = server.table(sql, 5 if per_pid else 4)
        stacks = stacks_of(server, {row[0] for row in counted})
        out = []
        for row in counted:
            stack = stacks.get(row[0]) or NOT_STORED     # one Stack per id, shared by its rows
            out.append(StackCount(row[2], int(row[3]) if per_pid else 0, stack,
                                  int(row[-1]), row[1]))
    except ServerError as e:
        raise UstackError(str(e)) from None
    except ValueError:                   # a number that is not one
        raise UstackError(f"{server.address}: the answer is not ClickHouse's: "
                          "a count is not a number") from None
    return out


PERIODS_LISTED = 10_000               # ~110 KB of query text (ClickHouse parses 256 KiB)


def _listed(starts) -> str:
    return ", ".join(map(str, starts))


def sums_plan(server: Server, f: Filter) -> tuple | None:
    """([(Sums, the starts of its periods it answers for)], what of the
    range is left to read from samples: a condition, '' for nothing), or
    None when no table of sums answers for any period.

    Coarsest first (SUMS): the whole days within the filter's range, then
    the whole hours of the rest, each one whose count of samples rows and
    their weight there equal the samples' own. A period a table lacks (before its view
    was made: an older database) or holds in part (an insert that reached
    one table of two when the server died) is read from samples: the
    answer is the same either way, only slower. Cheap: the `time` and
    `weight` columns of the range, and the sums' counts."""
    db = server.database
    names = ", ".join(quote(sums.table) for sums in SUMS)
    present = {row[0] for row in server.table(
        f"SELECT name FROM system.tables WHERE database = {quote(db)} AND name IN ({names})",
        1)}
    parts: list = []
    finest = None                        # (first, end, all its periods proven)
    for sums in SUMS:
        if sums.table not in present:
            continue
        span = sums.seconds * 10**9
        first = 0 if f.since_ns is None else -(-f.since_ns // span) * sums.seconds
        end = None if f.until_ns is None else f.until_ns // span * sums.seconds
        if end is not None and end <= first:
            continue
        rng = f"time >= toDateTime({first})" + (f" AND time < toDateTime({end})" if end else "")
        for coarser, starts in parts:    # the periods a coarser table answers already
            rng += f" AND toUInt32({coarser.start_of}(time)) NOT IN ({_listed(starts)})"
        # a period's rows counted and weighed in both: an insert missing from
        # either table (or one in it twice) changes them, and a loss and a
        # repeat of the same rows and weight in one period are not likely
        raw = server.table(f"SELECT toUInt32({sums.start_of}(time)) AS s, count(), "
                           f"sum(weight) FROM {db}.samples WHERE {rng} GROUP BY s", 3)
        summed = {s: (n, w) for s, n, w in server.table(
            f"SELECT toUInt32(start) AS s, sum(rows), sum(weight) FROM {db}.{sums.table} "
            f"WHERE {rng.replace('(time)', '(start)').replace('time ', 'start ')} "
            "GROUP BY s", 3)}
        proven = sorted(int(s) for s, n, w in raw
                        if summed.get(s) == (n, w))[-PERIODS_LISTED:]
        if proven:
            parts.append((sums, proven))
        finest = (first, end, len(proven) == len(raw))
        if finest[2] and not _edges(f, first, end):
            break                        # all of the range answered: no finer sums needed
    if not parts:
        return None
    first, end, whole = finest
    if not whole:                        # some periods from samples: all but those listed
        return parts, " AND ".join(f"toUInt32({sums.start_of}(time)) NOT IN "
                                   f"({_listed(starts)})" for sums, starts in parts)
    # every whole period proven: samples only for the part-periods at the
    # ends (a time range the sort key's index narrows)
    return parts, " OR ".join(_edges(f, first, end))


def _edges(f: Filter, first: int, end: int | None) -> list:
    """Conditions keeping the parts of the range before `first` and from
    `end` (seconds): the ends of the range no whole period covers."""
    edges = []
    if f.since_ns is not None and f.since_ns < first * 10**9:
        edges.append(f"time < toDateTime({first})")
    if end is not None and f.until_ns > end * 10**9:
        edges.append(f"time >= toDateTime({end})")
    return edges


# A stack's frames as one text (TabSeparated leaves these two separators as
# they are): each distinct frame is then one string, made into a Frame once
_FRAMES = ("arrayStringConcat(arrayMap((f, m, fl, l, lg, i) -> concat(f, '\x1f', m, "
           "'\x1f', fl, '\x1f', toString(l), '\x1f', lg, '\x1f', toString(i)), "
           "function, module, file, line, language, inlined), '\x1e')")


# A frames row as one text, as _FRAMES makes each frame of a stacks row
_FRAME = ("concat(function, '\x1f', module, '\x1f', file, '\x1f', toString(line), '\x1f', "
          "language, '\x1f', toString(inlined))")


def stacks_of(server: Server, ids: set, chunk: int = 8_000) -> dict:
    """stack_id (its text) -> Stack, by their ids (a list, not a second
    scan of the samples): from stack_frames and frames (the stack's frames'
    ids, then each frame's names once), then those not there from stacks
    (an older ustack's rows: the same ids, the frames' names in arrays);
    the ReplacingMergeTrees may not have merged a repeat yet: LIMIT 1 BY. A
    query lists `chunk` ids at most: ClickHouse parses 256 KiB of query
    text (max_query_size), and 8,000 ids of 20 digits are 176 KB."""
    stacks: dict = {}
    frames: dict = {}                    # a frame's text -> its Frame: a fleet's stacks
    ordered = sorted(ids)                # share most frames (bench: 900 of 100,000)
    if not all(i.isdigit() for i in ordered):
        raise ValueError("a stack id is not a number")   # (it goes into the next query)
    db = server.database
    tables = {row[0] for row in server.table(
        f"SELECT name FROM system.tables WHERE database = {quote(db)} AND name IN "
        f"({quote(FRAMES)}, {quote(STACK_FRAMES)})", 1)}
    if len(tables) == 2:
        by_id: dict = {}                 # frame id -> its Frame
        for i in range(0, len(ordered), chunk):
            listed = ", ".join(ordered[i:i + chunk])
            of_stacks = f"{db}.{STACK_FRAMES} WHERE stack_id IN ({listed})"
            for fid, text in server.table(
                    f"SELECT frame_id, {_FRAME} FROM {db}.{FRAMES} WHERE frame_id IN "
                    f"(SELECT arrayJoin(frame_ids) FROM {of_stacks}) LIMIT 1 BY frame_id", 2):
                by_id[fid] = frames.get(text) or _frame(text, frames)
            for sid, fids, notes in server.table(
                    "SELECT stack_id, arrayStringConcat(arrayMap(x -> toString(x), frame_ids), "
                    f"','), arrayStringConcat(notes, '\x1e') FROM {of_stacks} "
                    "LIMIT 1 BY stack_id", 3):
                stacks[sid] = Stack(tuple(by_id.get(f, FRAME_NOT_STORED)
                                          for f in fids.split(",") if f),
                                    tuple(notes.split("\x1e")) if notes else ())
        ordered = [sid for sid in ordered if sid not in stacks]
    for i in range(0, len(ordered), chunk):
        listed = ", ".join(ordered[i:i + chunk])
        for sid, texts, notes in server.table(
                f"SELECT stack_id, {_FRAMES}, arrayStringConcat(notes, '\x1e') "
                f"FROM {db}.stacks WHERE stack_id IN ({listed}) "
                "LIMIT 1 BY stack_id", 3):
            stacks[sid] = Stack(tuple(frames.get(t) or _frame(t, frames)
                                      for t in texts.split("\x1e") if t),
                                tuple(notes.split("\x1e")) if notes else ())
    return stacks


NOT_STORED = Stack((), ("stack not stored",))   # a row whose stack did not arrive
# a frame of a stored stack whose frames row did not arrive (a server
# emptied during a run: the run sends a frame's names once)
FRAME_NOT_STORED = Frame(0, "", function="(frame not stored)")


def _frame(text: str, frames: dict) -> Frame:
    """The Frame of a frame's text (_FRAMES), kept in `frames`."""
    fn, m, fl, ln, lang, il = text.split("\x1f")
    frame = frames[text] = Frame(0, m, file=fl, line=int(ln), inlined=il == "1",
                                 kind="" if lang == "native" else lang, **_named(fn))
    return frame


def _named(function: str) -> dict:
    """A stored name as the frame had it: the name stored for a frame
    without one (model.unnamed_function's `fn@0x11e0` or `0x11f6`, or
    `[unknown]`) becomes that frame's place again, so that every format
    names it as it did live."""
    if function == "[unknown]":
        return {"function": None}
    for prefix in ("fn@0x", "0x"):
        if function.startswith(prefix):
            try:
                where = int(function[len(prefix) - 2:], 16)
            except ValueError:
                break
            return {"function": None, "objaddr": where,
                    "objstart": where if prefix == "fn@0x" else 0}
    return {"function": function}

