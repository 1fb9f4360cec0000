"""The two tables ustack keeps in ClickHouse (docs/clickhouse.md says why
these engines and keys), created when missing, in the syntax 18.16 takes:

samples  a row per (interval, process[, thread], event, stack): the
         counted weight; sorted by host then time, so a host's or a time
         range's flame graph reads only its granules.
stacks   each distinct stack once, by its id (a hash of its frames):
         ReplacingMergeTree, so the same stack sent by fifty hosts, or
         twice by a retry, merges into one row."""
from __future__ import annotations

import hashlib

from ...model import Stack, unnamed_function

SAMPLES_COLUMNS = (
    "time DateTime, start_ns UInt64, duration_ns UInt64, host String, "
    "container String, pid UInt32, tid UInt32, comm String, executable String, "
    "build_id String, event String, weight UInt64, stack_id UInt64, batch String")
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
    ]


def stack_row(stack: Stack) -> dict:
    """The stacks row of a symbolized stack: its frames innermost first,
    by function (as the flame graphs merge them)."""
    frames = stack.frames
    functions = [f.function or unnamed_function(f) or "[unknown]" for f in frames]
    modules = [f.module for f in frames]
    files = [f.file for f in frames]
    lines = [f.line if f.line > 0 else 0 for f in frames]    # UInt32: unknown is 0
    languages = [f.kind or "native" for f in frames]
    inlined = [1 if f.inlined else 0 for f in frames]
    notes = list(stack.notes)
    return {"function": functions, "module": modules, "file": files, "line": lines,
            "language": languages, "inlined": inlined, "notes": notes,
            "stack_id": stack_id(functions, modules, files, lines, languages, inlined,
                                 notes)}


def stack_id(functions, modules, files, lines, languages, inlined, notes) -> int:
    """A 64-bit hash of what names the frames: the same on every host, so
    one stack is stored once however many send it. (Unit and record
    separators cannot be in a name ustack keeps: names are printable.)"""
    text = "\x1e".join(("\x1f".join(functions), "\x1f".join(modules), "\x1f".join(files),
                        str(lines), "\x1f".join(languages), str(inlined),
                        "\x1f".join(notes)))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
