"""Separate debug files, found the way gdb finds them:

1. by build-id: ROOT/.build-id/xx/yyyy.debug for each debug root;
2. by .gnu_debuglink (a file name and the CRC32 of that file): next to the
   object, in its .debug/ subdirectory, and ROOT/<object's directory>/NAME;
3. one fetched from a debuginfod server into ustack's cache (debuginfod.py);
4. MiniDebugInfo: an xz-compressed ELF with a .symtab in the object's own
   .gnu_debugdata section (Fedora ships local function names that way).

A debug file compressed by `dwz -m` (Fedora, RHEL) keeps the DWARF it
shares with other files in one alt file, named with its build-id in the
.gnu_debugaltlink section: find_alt_file() finds it.

The debug roots are the caller's extra directories (--debug-dir) first,
then /usr/lib/debug. A candidate whose build-id (or debuglink CRC) does not
match the object is refused and the refusal is reported, never used: a
wrong debug file gives wrong names."""
from __future__ import annotations

import os
import struct

from ..model import UstackError
from . import cache as objcache
from . import content_key
from .elf import ElfImage
from ..values import factory, value

DEBUG_ROOTS = ["/usr/lib/debug"]
_MAX_MINIDEBUGINFO = 256 << 20   # bytes an .gnu_debugdata may expand to


@value(frozen=False)
class DebugLookup:
    """What the search found: the debug file (or None) and why candidates
    were refused, one sentence each."""
    path: str | None = None
    how: str = ""                  # build-id | debuglink | debuginfod | minidebuginfo | altlink
    refused: list = factory(list)


def debug_roots(extra_dirs=()) -> list:
    return [*extra_dirs, *DEBUG_ROOTS]


def _build_id_candidates(build_id: str | None, extra_dirs) -> list:
    if not build_id or len(build_id) < 3:
        return []
    return [os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")
            for root in debug_roots(extra_dirs)]


def _debuglink(image: ElfImage) -> tuple | None:
    """(file name, CRC) from the object's .gnu_debuglink, or None."""
    raw = image.file.section_bytes(".gnu_debuglink")
    if not raw:
        return None
    name, _, _ = raw.partition(b"\0")
    # the CRC is the last 4 bytes, after the name padded to 4 bytes
    if not name or len(raw) < 4 or len(raw) % 4:
        return None
    return os.fsdecode(name), struct.unpack_from(
        "<I" if image.file.little_endian else ">I", raw, len(raw) - 4)[0]


def debuglink_candidates(object_path: str, name: str, extra_dirs=()) -> list:
    """Where gdb looks for a .gnu_debuglink NAME of the object at object_path."""
    if os.path.basename(name) != name:     # a name, not a path (no ../ tricks)
        return []
    d = os.path.dirname(os.path.realpath(object_path))
    out = [os.path.join(d, name), os.path.join(d, ".debug", name)]
    out += [os.path.join(root, d.lstrip("/"), name) for root in debug_roots(extra_dirs)]
    return out


def file_crc32(path: str) -> int:
    """The CRC .gnu_debuglink records: zlib's CRC-32 of the whole file."""
    import zlib     # only for a debuglink (~0.6 ms to import)
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def find_debug_file(image: ElfImage, extra_dirs=()) -> DebugLookup:
    """The separate debug file of `image` (build-id first, then debuglink)."""
    found = DebugLookup()
    for path in _build_id_candidates(image.file.build_id, extra_dirs):
        if os.path.exists(path) and _accept(image, path, None, found):
            found.path, found.how = path, "build-id"
            return found
    try:
        link = _debuglink(image)
    except UstackError:   # unreadable: ElfImage already opened it, so rare
        link = None
    if link is not None:
        name, crc = link
        for path in debuglink_candidates(image.path, name, extra_dirs):
            if (os.path.isfile(path) and not _same_file(path, image.path)
                    and _accept(image, path, crc, found)):
                found.path, found.how = path, "debuglink"
                return found
    return found


def debug_candidates(image: ElfImage, extra_dirs=()) -> list:
    """Every path find_debug_file() may look at for `image`: its answer
    stays the same while none of them changes (nor the object)."""
    out = _build_id_candidates(image.file.build_id, extra_dirs)
    try:
        link = _debuglink(image)
    except UstackError:
        link = None
    if link is not None:
        out += debuglink_candidates(image.path, link[0], extra_dirs)
    return out


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _accept(image: ElfImage, path: str, crc: int | None, found: DebugLookup) -> bool:
    """Whether the candidate debug file belongs to `image`; records why not."""
    try:
        debug = ElfImage.open(path)
    except UstackError as e:
        found.refused.append(f"{e}; not used as debug file of {image.path}")
        return False
    if image.file.build_id and debug.file.build_id and debug.file.build_id != image.file.build_id:
        found.refused.append(f"{path}: build-id {debug.file.build_id} does not match "
                             f"{image.path} ({image.file.build_id}); not used")
        return False
    if crc is not None:
        try:
            actual = file_crc32(path)
        except OSError as e:
            found.refused.append(f"{path}: {e.strerror}; not used")
            return False
        if actual != crc:
            found.refused.append(f"{path}: CRC {actual:08x} does not match the "
                                 f".gnu_debuglink of {image.path} ({crc:08x}); not used")
            return False
    elif not (image.file.build_id and debug.file.build_id):
        found.refused.append(f"{path}: has no build-id to match {image.path}; not used")
        return False
    return True


def _altlink(image: ElfImage) -> tuple | None:
    """(path, build-id hex) from .gnu_debugaltlink, or None."""
    raw = image.file.section_bytes(".gnu_debugaltlink")
    if not raw:
        return None
    name, nul, build_id = raw.partition(b"\0")
    if not name or not nul or not build_id:
        return None
    return os.fsdecode(name), build_id.hex()


def find_alt_file(image: ElfImage, extra_dirs=()) -> DebugLookup:
    """The dwz alt file of a debug file, the way gdb finds it: the path in
    .gnu_debugaltlink (a relative one from the debug file's directory,
    as named and as resolved), else by its build-id under the debug roots.
    found.path stays None when the file has no link, or no candidate has
    the build-id the link names (those are listed in found.refused)."""
    found = DebugLookup()
    try:
        link = _altlink(image)
    except UstackError:
        link = None
    if link is None:
        return found
    name, build_id = link
    if os.path.isabs(name):
        candidates = [name]
    else:
        candidates = [os.path.join(os.path.dirname(image.path), name),
                      os.path.join(os.path.dirname(os.path.realpath(image.path)), name)]
    candidates += _build_id_candidates(build_id, extra_dirs)
    for path in dict.fromkeys(candidates):
        if not os.path.isfile(path):
            continue
        try:
            alt = ElfImage.open(path)
        except UstackError as e:
            found.refused.append(f"{e}; not used as dwz alt file of {image.path}")
            continue
        if alt.build_id != build_id:
            found.refused.append(f"{path}: build-id {alt.build_id} is not the one "
                                 f"{image.path} links to ({build_id}); not used")
            continue
        found.path, found.how = path, "altlink"
        return found
    found.refused.append(f"{image.path}: dwz alt file {name} (build-id {build_id}) "
                         "not found; names it holds are missing")
    return found


def minidebuginfo_path(image: ElfImage, found: DebugLookup) -> str | None:
    """The ELF inside the object's .gnu_debugdata, decompressed into the
    cache (so the symbol cache can key it by file identity), or None.
    Named by a hash of the compressed bytes, remembered per file version."""
    if not image.file.sections.get(".gnu_debugdata", (0, 0, 0))[2]:
        return None
    try:
        key = content_key.remembered("minidebuginfo", os.stat(image.path),
                                     lambda: _debugdata_key(_debugdata(image)))
    except (OSError, UstackError):
        return None
    out = objcache.cache_file("minidebuginfo", key, "elf")
    if objcache.checked_file(out):
        return out                  # decompressed before, and whole
    try:
        data = _debugdata(image)
    except UstackError:
        return None
    # named by the bytes decompressed here: the file may have changed since
    out = objcache.cache_file("minidebuginfo", _debugdata_key(data), "elf")
    import lzma                     # only MiniDebugInfo is xz: imported here
    try:
        dec = lzma.LZMADecompressor()
        elf = dec.decompress(data, max_length=_MAX_MINIDEBUGINFO)
    except lzma.LZMAError as e:
        found.refused.append(f"{image.path}: corrupt .gnu_debugdata ({e}); not used")
        return None
    if not elf.startswith(b"\x7fELF"):
        found.refused.append(f"{image.path}: .gnu_debugdata holds no ELF file; not used")
        return None
    objcache.write_checked_file(out, elf)
    if objcache.checked_file(out):
        return out
    found.refused.append(f"{image.path}: cannot write {out}; MiniDebugInfo not used")
    return None


def _debugdata(image: ElfImage) -> bytes:
    return image.file.section_bytes(".gnu_debugdata") or b""


def _debugdata_key(data: bytes) -> str:
    return content_key.of("minidebuginfo", data)


def debug_lookup(image: ElfImage, extra_dirs=()) -> tuple:
    """(debug ElfImage or None, DebugLookup): a separate debug file when one
    matches, else the MiniDebugInfo, else None."""
    found = find_debug_file(image, extra_dirs)
    if found.path is None:
        from .fetched_debug import cached_debug_file   # only without a local debug file
        fetched = cached_debug_file(image.file.build_id)
        if fetched is not None and _accept(image, fetched, None, found):
            found.path, found.how = fetched, "debuginfod"
    if found.path is None:
        mini = minidebuginfo_path(image, found)
        if mini is not None:
            found.path, found.how = mini, "minidebuginfo"
    if found.path is None:
        return None, found
    try:
        return ElfImage.open(found.path), found
    except UstackError as e:
        found.refused.append(f"{e}; not used as debug file of {image.path}")
        found.path = None
        return None, found
