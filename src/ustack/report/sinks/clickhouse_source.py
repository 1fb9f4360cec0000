"""`ustack report --from clickhouse://HOST:PORT/DB`: the counted stacks
`--every --to` sent, summed over the hosts, processes and time the
filters keep, as the StackCounts every counted format takes."""
from __future__ import annotations

from ...model import Frame, Stack, StackCount, UstackError
from .clickhouse_http import Server, ServerError, quote
from .clickhouse_schema import HOURLY
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
        split = (None if per_pid or f.hosts or f.pids or f.containers
                 else hourly_split(server, f))
        if split:
            hours, rest = split
            kept = where(Filter(comms=f.comms, event=f.event))
            sql = (f"SELECT {keys}, weight AS w FROM {db}.{HOURLY} "
                   f"WHERE toUInt32(hour) IN ({', '.join(map(str, hours))}) AND {kept}")
            if rest:
                sql += (f" UNION ALL SELECT {keys}, weight AS w FROM {db}.samples "
                        f"WHERE {cond} AND ({rest})")
            sql = f"SELECT {keys}, sum(w) FROM ({sql}) GROUP BY {keys}"
        else:
            sql = f"SELECT {keys}, sum(weight) FROM {db}.samples WHERE {cond} GROUP BY {keys}"
        counted = server.rows(sql)
        stacks = stacks_of(server, {int(row[0]) for row in counted})
    except ServerError as e:
        raise UstackError(str(e)) from None
    out = []
    for row in counted:
        sid, event = int(row[0]), row[1]
        comm, pid = row[2], (int(row[3]) if per_pid else 0)
        stack = stacks.get(sid) or NOT_STORED     # one Stack per id, shared by its rows
        out.append(StackCount(comm, pid, stack, int(row[-1]), event))
    return out


HOUR_S = 3600
HOURS_LISTED = 20_000                # ~230 KB of query text at most (ClickHouse parses 256 KiB)


def hourly_split(server: Server, f: Filter) -> tuple | None:
    """(the hours, by their starts in seconds, samples_hourly answers for;
    what of the range is left to read from samples, a condition, '' for
    nothing), or None when samples_hourly answers for no hour.

    The hours within the filter's range whose total there equals the
    samples' own. An hour it lacks (before the view was made: an older
    database) or holds in part (an insert that reached one table of the
    two when the server died) is read from samples, so the answer is the
    same either way, only slower. Cheap: time and weight of the range
    only, against a table ~17 times smaller."""
    db = server.database
    if not server.rows(f"SELECT name FROM system.tables WHERE database = {quote(db)} "
                       f"AND name = {quote(HOURLY)}"):
        return None
    first = 0 if f.since_ns is None else -(-f.since_ns // (HOUR_S * 10**9)) * HOUR_S
    end = None if f.until_ns is None else f.until_ns // (HOUR_S * 10**9) * HOUR_S
    if end is not None and end <= first:
        return None
    rng = f"time >= toDateTime({first})" + (f" AND time < toDateTime({end})" if end else "")
    raw = server.rows(f"SELECT toUInt32(toStartOfHour(time)) AS h, sum(weight) "
                      f"FROM {db}.samples WHERE {rng} GROUP BY h")
    summed = dict(server.rows(f"SELECT toUInt32(hour) AS h, sum(weight) FROM {db}.{HOURLY} "
                              f"WHERE {rng.replace('time', 'hour')} GROUP BY h"))
    hours = sorted(int(h) for h, total in raw if summed.get(h) == total)[-HOURS_LISTED:]
    if not hours:
        return None
    if len(hours) < len(raw):            # some hours from samples: all but those listed
        return hours, f"toUInt32(toStartOfHour(time)) NOT IN ({', '.join(map(str, hours))})"
    # every hour of the whole hours proven: samples only for the part-hours at
    # the ends (a time range the sort key's index narrows)
    edges = []
    if f.since_ns is not None and f.since_ns < first * 10**9:
        edges.append(f"time < toDateTime({first})")
    if end is not None and f.until_ns > end * 10**9:
        edges.append(f"time >= toDateTime({end})")
    return hours, " OR ".join(edges)


def stacks_of(server: Server, ids: set, chunk: int = 8_000) -> dict:
    """stack_id -> Stack, by their ids (a list, not a second scan of the
    samples); the ReplacingMergeTree may not have merged a repeat yet: any().
    A query lists `chunk` ids at most: ClickHouse parses 256 KiB of query
    text (max_query_size), and 8,000 ids of 20 digits are 176 KB."""
    stacks: dict = {}
    frames: dict = {}
    ordered = sorted(ids)
    for i in range(0, len(ordered), chunk):
        listed = ", ".join(map(str, ordered[i:i + chunk]))
        for row in server.rows(
                f"SELECT stack_id, any(function), any(module), any(file), any(line), "
                f"any(language), any(inlined), any(notes) FROM {server.database}.stacks "
                f"WHERE stack_id IN ({listed}) GROUP BY stack_id"):
            stacks[int(row[0])] = _stack(row[1:], frames)
    return stacks


NOT_STORED = Stack((), ("stack not stored",))   # a row whose stack did not arrive


def _stack(row, frames: dict) -> Stack:
    """A stacks row as a Stack; `frames` keeps each distinct frame made
    (a fleet's stacks share most of their frames: 5,000 stacks of 20
    frames, 900 distinct, in bench/clickhouse.py's table)."""
    functions, modules, files, lines, languages, inlined, notes = row
    made = []
    for key in zip(functions, modules, files, lines, languages, inlined):
        frame = frames.get(key)
        if frame is None:
            fn, m, fl, ln, lang, il = key
            frame = frames[key] = Frame(0, m, file=fl, line=int(ln), inlined=bool(int(il)),
                                        kind="" if lang == "native" else lang, **_named(fn))
        made.append(frame)
    return Stack(tuple(made), tuple(notes))


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

