"""An ElfImage's cache state: what parsing a file found, as one blob the
image cache keeps per file identity, and back. Three lines: the layout
(ElfFile.layout, JSON), the symbols (JSON) and the packed address lookup;
the last two stay undecoded until ElfSymbols is asked (elf_symbols.py)."""
from __future__ import annotations

import json

from .elf_file import ElfFile
from .elf_symbols import ElfSymbols

STATE_VERSION = "v6"    # of the blob's layout; v6: framed (cache.py)


def pack(file: ElfFile, symbols: ElfSymbols) -> bytes:
    return b"\n".join([json.dumps(file.layout()).encode(), *symbols.pack()])


def unpack(path: str, blob: bytes | None, reparse) -> tuple | None:
    """(ElfFile, ElfSymbols) from `blob`, or None when there is nothing to
    trust (corrupt, or of another layout: the file is parsed again)."""
    if not blob:
        return None
    layout, _, rest = blob.partition(b"\n")
    symbols, _, lookup = rest.partition(b"\n")
    try:
        file = ElfFile(path, json.loads(layout))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    if not symbols or not lookup:
        return None
    return file, ElfSymbols.saved(symbols, lookup, reparse)
