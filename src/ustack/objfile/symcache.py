"""file:line and inlined calls at an address from a SymCache: Sentry's
`symbolic` (Rust) turns a whole file's DWARF — functions, line rows, inline
chains — into one compact table in ~0.2 s for libc's debug file, where
pyelftools needs seconds per hundred units.

symbolic builds the table; reading it is done here, for two reasons:
symbolic's own lookup gives file paths "cleaned" (./iconv/./iconv/x.c
becomes iconv/iconv/x.c) where eu-addr2line, and users, see the DWARF
paths as written; and a warm run then needs neither symbolic nor cffi
(~50 ms of imports). The table is symbolic's SymCache format version 9
(symbolic-symcache/src/raw/v9.rs), little-endian:

  "SYMC" u32 version | header: debug id (32 bytes), arch, numbers of files,
  functions, source locations, ranges, string bytes (u32 each), 16 reserved
  | files [comp_dir, directory, name, 3 more string offsets]
  | functions [name, comp_dir, entry_pc, language]
  | source locations [file, line, function, inlined-into location]
  | ranges [start address]       (each section 8-byte aligned)
  | strings (ULEB128 length, UTF-8 bytes)

The last len(ranges) source locations belong to the ranges, one each; a
location's `inlined-into` index chains to its caller's location (at the
line of the call). 0xffffffff means none. Addresses are 32-bit: objects
whose code lies above 4 GiB are not covered (the caller falls back)."""
from __future__ import annotations

import bisect
import os
import struct

from .leb128 import uleb128

FORMAT_VERSION = 9
_NONE = 0xFFFFFFFF
_HEADER = struct.Struct("<4sI32xIIIIII16x")   # magic, version, debug id, arch, counts
_FILE_WORDS, _FUNCTION_WORDS, _LOCATION_WORDS = 6, 4, 4


class SymCacheError(Exception):
    """The bytes are not a SymCache this reader understands."""


def build(path: str) -> bytes:
    """A SymCache of the ELF file at `path`, built by symbolic. Raises
    SymCacheError when symbolic is missing or cannot read the file."""
    try:
        from symbolic.debuginfo import Archive
        from symbolic.exceptions import SymbolicError
    except ImportError as e:
        raise SymCacheError(f"symbolic is not installed ({e})") from None
    import io
    try:
        archive = Archive.open(path)
        objects = list(archive.iter_objects())
        if len(objects) != 1:
            raise SymCacheError(f"{len(objects)} objects in the file")
        out = io.BytesIO()
        objects[0].make_symcache().dump_into(out)
    except SymbolicError as e:
        raise SymCacheError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return out.getvalue()


def _align(offset: int) -> int:
    return (offset + 7) & ~7


class SymCache:
    """One SymCache, read in place (nothing is decoded before a lookup)."""

    def __init__(self, data):
        """`data`: bytes or a read-only mmap of them."""
        if len(data) < _HEADER.size:
            raise SymCacheError("too short")
        magic, version, _arch, n_files, n_functions, n_locations, n_ranges, n_strings = \
            _HEADER.unpack_from(data, 0)
        if magic != b"SYMC":
            raise SymCacheError("not a SymCache")
        if version != FORMAT_VERSION:
            raise SymCacheError(f"SymCache format {version}, this reader knows {FORMAT_VERSION}")
        if n_ranges > n_locations:
            raise SymCacheError("more ranges than source locations")
        view = memoryview(data)
        offset = _align(_HEADER.size)
        arrays = []
        for count, size in ((n_files, 4 * _FILE_WORDS), (n_functions, 4 * _FUNCTION_WORDS),
                            (n_locations, 4 * _LOCATION_WORDS), (n_ranges, 4)):
            end = offset + count * size
            if end > len(data):
                raise SymCacheError("truncated")
            arrays.append(view[offset:end].cast("I"))
            offset = _align(end)
        if offset + n_strings > len(data):
            raise SymCacheError("truncated strings")
        self._files, self._functions, self._locations, self._ranges = arrays
        self._strings = view[offset:offset + n_strings]
        self._first_range_location = n_locations - n_ranges
        self._paths: dict = {}       # file index -> joined path
        self._names: dict = {}       # function index -> name

    def locate(self, vaddr: int) -> tuple | None:
        """[(function, file, line)] at vaddr, innermost inlined call first and
        the real function last; () when no function covers vaddr; None when
        only a symbol (no line) does: the table cannot tell more, DWARF may."""
        if vaddr >= _NONE:
            return None              # beyond the table's 32-bit addresses
        i = bisect.bisect_right(self._ranges, vaddr) - 1
        if i < 0:
            return ()
        index = self._first_range_location + i
        chain = []
        locations = self._locations
        for _ in range(256):        # bounds a corrupt, cyclic chain
            if index == _NONE or index * 4 + 4 > len(locations):
                break
            file, line, function, index = locations[index * 4:index * 4 + 4]
            if file == _NONE and function == _NONE:
                break                # the explicit "nothing here" after a function's end
            line = 0 if line == _NONE else line
            # a line-table row of line 0 ("no line") names no file either, as
            # eu-addr2line's ??:0; a call site (DW_AT_call_file) keeps its file
            path = self._path(file) if line or chain else ""
            chain.append((self._function(function), path, line))
        if not chain:
            return ()
        if not any(line for _f, _p, line in chain):
            return None
        return tuple(chain)

    def _function(self, index: int) -> str:
        name = self._names.get(index)
        if name is None:
            name = ""
            if index != _NONE and index * 4 < len(self._functions):
                name = self._string(self._functions[index * 4]) or ""
            self._names[index] = name
        return name

    def _path(self, index: int) -> str:
        """comp_dir/directory/name joined as eu-addr2line joins them: a
        relative directory under the compilation directory, nothing cleaned."""
        path = self._paths.get(index)
        if path is None:
            path = ""
            if index != _NONE and (index + 1) * _FILE_WORDS <= len(self._files):
                comp_dir, directory, name = self._files[index * _FILE_WORDS:index * _FILE_WORDS + 3]
                path = os.path.join(self._string(directory) or "", self._string(name) or "")
                comp_dir = self._string(comp_dir)
                if comp_dir and not os.path.isabs(path):
                    path = os.path.join(comp_dir, path)
            self._paths[index] = path
        return path

    def _string(self, offset: int) -> str | None:
        if offset == _NONE or offset >= len(self._strings):
            return None
        try:
            size, start = uleb128(self._strings, offset)
        except IndexError:
            return None
        return bytes(self._strings[start:start + size]).decode("utf-8", "replace")
