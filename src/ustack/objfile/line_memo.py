"""Source locations libdw gave for one file, kept on disk per file version: a
later run asking the same addresses (a second report of one recording, a
profile of the same hot code) reads them back in a millisecond instead of
opening the DWARF again (~40 ms of decompressing libc's alone).

The memo is written once, when the process exits (or when the tables are
dropped, objfile.dwarf_lines.LineTable.clear_cache), with everything it
held: a run adds to what earlier runs answered, up to _MAX_ENTRIES."""
from __future__ import annotations

import atexit
import json

from . import cache as objcache

VERSION = 1
_MAX_ENTRIES = 1 << 16
_unsaved: set = set()     # memos holding answers their file lacks


class LineMemo:
    """{vaddr: ((function, file, line), ...)} of one file."""

    def __init__(self, path: str, store: bool = True):
        """`path`: the cache file; `store`: False keeps the answers in memory
        only (they lack names a missing dwz alt file holds)."""
        self.path = path
        self._store = store
        self._answers: dict | None = None    # read on first use

    def get(self, vaddr: int) -> tuple | None:
        if self._answers is None:
            self._answers = self._load()
        return self._answers.get(vaddr)

    def __len__(self) -> int:
        if self._answers is None:
            self._answers = self._load()
        return len(self._answers)

    def put(self, vaddr: int, chain: tuple) -> None:
        if self._answers is None:
            self._answers = self._load()
        if len(self._answers) < _MAX_ENTRIES:
            self._answers[vaddr] = chain
            if self._store:
                _unsaved.add(self)

    def forget(self) -> None:
        """Keep nothing more on disk (a SymCache now answers for the file)."""
        _unsaved.discard(self)

    def _load(self) -> dict:
        blob = objcache.read(self.path)
        if not blob:
            return {}
        try:
            d = json.loads(blob)
            if d["version"] != VERSION:
                return {}
            strings = d["strings"]
            out = {}
            for row in d["answers"]:     # vaddr, then (function, file, line) triples
                out[row[0]] = tuple((strings[row[i]], strings[row[i + 1]], row[i + 2])
                                    for i in range(1, len(row), 3))
            return out
        except (ValueError, TypeError, KeyError, IndexError):
            return {}                    # damaged: answered again

    def save(self) -> None:
        """Write the answers when this run added some."""
        if self not in _unsaved:
            return
        _unsaved.discard(self)
        strings: dict = {}
        rows = []
        for vaddr, chain in self._answers.items():
            row = [vaddr]
            for function, file, line in chain:
                row += [strings.setdefault(function, len(strings)),
                        strings.setdefault(file, len(strings)), line]
            rows.append(row)
        blob = json.dumps({"version": VERSION, "strings": list(strings), "answers": rows},
                          separators=(",", ":"))
        objcache.write(self.path, blob.encode())


@atexit.register
def save_all() -> None:
    for memo in list(_unsaved):
        memo.save()
