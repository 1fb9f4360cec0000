"""An ElfImage's cache state: what parsing a file found, as one blob the
image cache keeps per file identity, and back. Three lines: the layout
(ElfFile.layout, JSON), the symbols (JSON) and the packed address lookup;
the last two stay undecoded until ElfSymbols is asked (elf_symbols.py)."""
from __future__ import annotations

import json

from .elf_file import ElfFile
from .elf_symbols import ElfSymbols

STATE_VERSION = "v8"    # of the blob's layout; v6: framed (cache.py); v8: the longest of equal local aliases


def pack(file: ElfFile, symbols: ElfSymbols) -> bytes:
    return b"\n".join([json.dumps(file.layout()).encode(), *symbols.pack()])


def pack_layout(file: ElfFile) -> bytes:
    """The layout alone (an image whose symbols are not built yet)."""
    return json.dumps(file.layout()).encode()


def unpack_layout(path: str, blob: bytes | None) -> ElfFile | None:
    """pack_layout()'s ElfFile, or None when there is nothing to trust."""
    if not blob:
        return None
    try:
        return ElfFile(path, json.loads(blob))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


_KEPT_SYMBOLS = 1 << 20     # a bigger symbol list is read again from the cache when asked


def unpack(path: str, blob: bytes | None, reparse, reread=None) -> tuple | None:
    """(ElfFile, ElfSymbols) from `blob`, or None when there is nothing to
    trust (corrupt, or of another layout: the file is parsed again).
    `reread`: gives the blob again; a big symbol list is then not kept in
    memory until it is decoded (node's: 12 MB, while naming frames needs
    only the address table)."""
    lines = _lines(blob)
    if lines is None:
        return None
    first, second = lines
    try:
        file = ElfFile(path, json.loads(blob[:first]))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    if reread is not None and second - first > _KEPT_SYMBOLS:
        def symbols():
            again = reread()
            found = _lines(again)
            return again[found[0] + 1:found[1]] if found else None
        return file, ElfSymbols.saved(symbols, blob[second + 1:], reparse)
    # views of the blob, kept whole either way: a copy of each part cost
    # ~0.5 MB for libc's, and naming frames decodes its symbols rarely
    return file, ElfSymbols.saved(lambda: blob[first + 1:second],
                                  memoryview(blob)[second + 1:], reparse)


def _lines(blob: bytes | None) -> tuple | None:
    """Where the blob's first two lines end (the layout's, the symbols'),
    or None unless all three lines have something."""
    if not blob:
        return None
    first = blob.find(b"\n")
    second = blob.find(b"\n", first + 1) if first > 0 else -1
    if second < 0 or second == first + 1 or second == len(blob) - 1:
        return None
    return first, second
