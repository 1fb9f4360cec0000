"""The cache keys of an object's unwind tables (unwind/cfi.py) and kernel
rows (unwind/tables.py): hashes of the bytes they are built from, the CFI
sections of the object and of its debug file (objfile/content_key.py),
never its build-id. Light on purpose: a run whose tables come from the
cache computes these keys (remembered per file version) and nothing else
of cfi.py's."""
from __future__ import annotations

import json
import os

from ..model import UstackError
from ..objfile import content_key
from ..objfile.cache import memo_key
from ..objfile.debuginfo import DebugLookup, debug_candidates, debug_roots, find_debug_file
from ..objfile.elf import ElfImage

CFI_SECTIONS = (".eh_frame", ".debug_frame")
_debug_files: dict = {}     # (object's memo key, debug roots) -> DebugLookup


def debug_file(image: ElfImage, st: os.stat_result, debug_dirs=()) -> DebugLookup:
    """find_debug_file()'s answer for `image` (whose stat is `st`), looked
    for once per process, and kept on disk for this version of the object
    while none of the paths it looked at changes: the kernel rows and the
    unwinder both key their tables by it, and deciding whether a candidate
    belongs to the object opens it (a debug file whose functions are never
    asked is parsed anew each run: ~15 ms of libc's on a busy machine).
    A copy: callers add to its refusals."""
    roots = tuple(debug_roots(debug_dirs))
    key = (memo_key(st), roots)
    found = _debug_files.get(key)
    if found is None:
        found = _debug_files[key] = _remembered_debug_file(image, st, roots, debug_dirs)
    return DebugLookup(found.path, found.how, list(found.refused))


def _remembered_debug_file(image: ElfImage, st: os.stat_result, roots: tuple,
                           debug_dirs) -> DebugLookup:
    kind = "debugfile." + content_key.of("roots", *roots)[:16]
    candidates = [[path, _version(path)] for path in debug_candidates(image, debug_dirs)]
    blob = content_key.saved(kind, st)
    if blob:
        try:
            saved = json.loads(blob)
            if saved["candidates"] == candidates:
                return DebugLookup(saved["path"], saved["how"], list(saved["refused"]))
        except (ValueError, KeyError, TypeError):
            pass                        # damaged: looked for again
    found = find_debug_file(image, debug_dirs)
    content_key.save(kind, st, json.dumps({
        "candidates": candidates, "path": found.path, "how": found.how,
        "refused": found.refused}).encode())
    return found


def _version(path: str) -> list | None:
    """A candidate's version (content_key.identity), None when it is not there."""
    try:
        return list(content_key.identity(os.stat(path)))
    except OSError:
        return None


def forget() -> None:
    """Look for debug files again (UnwindTable.clear_cache)."""
    _debug_files.clear()


def cfi_sections(image: ElfImage) -> list:
    """(data, vaddr, is_eh) of the CFI sections that have content,
    .eh_frame first: it is what the compiler meant for unwinding."""
    out = []
    for name in CFI_SECTIONS:
        data = image.file.section_bytes(name)
        if data:
            out.append((data, image.file.sections[name][0], name == ".eh_frame"))
    return out


def sections_key(sections: list) -> str:
    """The key of cfi_sections()'s answer: the bytes a table is built from."""
    hasher = content_key.Hasher("cfi-sections")
    for data, vaddr, eh in sections:
        hasher.add(f"{vaddr}:{eh}").add(data)
    return hasher.key()


def table_key(image: ElfImage, st: os.stat_result, found: DebugLookup) -> str:
    """The key of the table of `image` (whose stat is `st`) and its debug
    file `found`, as cfi.py's builder names what it built (table_of)."""
    own = content_key.remembered("cfi", st, lambda: sections_key(cfi_sections(image)))
    return table_of(own, debug_key(found))


def table_of(own: str, debug: str) -> str:
    """The table key of an object's and its debug file's section keys."""
    return content_key.of("cfi", own, debug)


def debug_key(found: DebugLookup) -> str:
    """The section key of the debug file found ("" for none)."""
    if found.path is None:
        return ""
    try:
        return content_key.remembered(
            "cfi", os.stat(found.path),
            lambda: sections_key(cfi_sections(ElfImage.open(found.path))))
    except (OSError, UstackError):
        return UNREADABLE


UNREADABLE = "unreadable"       # a debug file whose CFI is refused: none used
