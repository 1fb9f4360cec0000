"""An ELF image in memory holding only the DWARF sections libdw reads for
file:line and inlined calls, already inflated, for native.libdw to open
instead of the file.

Why: libdw 0.188's dwarf_begin inflates every compressed .debug_* section
of the file, one after the other, with zlib: ~40 ms for libc's debug file,
most of a cold eu-addr2line run. Here only SECTIONS are inflated (not
.debug_loclists, .debug_frame, .debug_macro, ...), by libdeflate
(native.libdeflate, else zlib) straight into the image, the largest in one
thread and the rest in another: ~15 ms. The image is memory only (~9 MB
for libc), never written to disk: a cold run stays cold.

Only ELF64 little-endian files with SHF_COMPRESSED DWARF and no dwz alt
file get an image; libdw opens the others as before."""
from __future__ import annotations

import mmap
import struct

from ..native import libdeflate
from ..model import UstackError
from .elf import ElfImage

# What dwarf_addrdie, dwarf_getsrc_die, dwarf_getscopes(_die) and the
# attribute/string calls of native.libdw read: unit lookup (.debug_aranges),
# DIEs and their abbreviations, line programs, strings in all three DWARF 5
# forms, address and range lists. On libc's debug file each of those it has
# changes answers when left out; .debug_loclists changes none.
SECTIONS = (".debug_info", ".debug_abbrev", ".debug_aranges", ".debug_line",
            ".debug_line_str", ".debug_str", ".debug_str_offsets", ".debug_addr",
            ".debug_ranges", ".debug_rnglists", ".debug_types")

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")     # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")           # Elf64_Shdr
_SHT_PROGBITS, _SHT_STRTAB = 1, 3
_MAX_RATIO = 1032          # deflate's most: a larger claimed size is corrupt


def wanted(image: ElfImage) -> bool:
    """Whether an image saves libdw work: some DWARF section is compressed
    (an uncompressed file is mapped by libdw as it is)."""
    return (image.file.little_endian and image.file.elfclass == 64
            and ".gnu_debugaltlink" not in image.file.section_names
            and not any(n.startswith(".zdebug") for n in image.file.section_names)
            and any(image.file.is_compressed(n) for n in image.file.section_names
                    if n.startswith(".debug_")))


class Pending:
    """An image being filled by two threads; result() waits for them."""

    def __init__(self, image: ElfImage, buffer: mmap.mmap, places: dict, raw: dict):
        """`places`: {name: (offset in buffer, size, stream start or None
        when not compressed)}; `raw`: {name: file bytes}."""
        self._image = image
        self._buffer = buffer
        self._places = places
        self._raw = raw
        self._failed: list = []
        names = sorted(raw, key=lambda n: len(raw[n]), reverse=True)
        import threading    # only when inflating: ~0.8 ms to import
        self._threads = [threading.Thread(target=self._fill, args=(group,), daemon=True)
                         for group in (names[:1], names[1:]) if group]
        for thread in self._threads:
            thread.start()

    def _fill(self, names: list) -> None:
        try:
            for name in names:
                offset, size, start = self._places[name]
                data = self._raw[name]
                if start is not None and libdeflate.available():
                    libdeflate.zlib_inflate_into(data, start, self._buffer, offset, size)
                    continue
                if start is not None:
                    data = self._image.file.inflated(name, data)       # zlib
                if len(data) != size:
                    raise UstackError(f"{name} is shorter than its header says")
                self._buffer[offset:offset + size] = data
        except (UstackError, libdeflate.DeflateError) as e:
            self._failed.append(e)

    def result(self) -> mmap.mmap | None:
        """The image, None when a section could not be inflated to the size
        its header says (libdw then opens the file and says what is wrong)."""
        for thread in self._threads:
            thread.join()
        return None if self._failed else self._buffer


def start(image: ElfImage) -> Pending | None:
    """The image of `image`'s SECTIONS being made, None when wanted() is
    False or the compression headers are corrupt. The file is read here, in
    the caller's thread; the inflating goes on in threads."""
    if not wanted(image):
        return None
    raw = {n: image.file.section_file_bytes(n) for n in SECTIONS if n in image.file.section_names}
    raw = {n: data for n, data in raw.items() if data}
    if not raw:
        return None
    try:
        streams = {n: image.file.compression_header(n, raw[n]) if image.file.is_compressed(n)
                   else (None, len(raw[n])) for n in raw}
    except UstackError:
        return None
    if sum(size for _s, size in streams.values()) > _MAX_RATIO * sum(map(len, raw.values())):
        return None                              # headers claim more than deflate can hold
    try:
        buffer, offsets = _layout(image.file.file_bytes(0, _EHDR.size),
                                  {n: size for n, (_s, size) in streams.items()})
    except (struct.error, OSError, UstackError):
        return None                              # a short header, no memory
    places = {n: (offsets[n], streams[n][1], streams[n][0]) for n in raw}
    return Pending(image, buffer, places, raw)


def build(image: ElfImage) -> mmap.mmap | None:
    """The image of `image`'s SECTIONS, made now (see start())."""
    pending = start(image)
    return pending.result() if pending is not None else None


def _layout(header: bytes, sizes: dict) -> tuple:
    """(the image's memory with its headers written, {name: offset} of each
    section's contents in it): the ELF header (`header`, the file's, with the
    section header fields changed), .shstrtab, the sections of `sizes`
    ({name: size}), then the section header table: [0] null, [1] .shstrtab,
    then one SHT_PROGBITS section per name."""
    names = [".shstrtab", *sizes]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    lengths = [len(shstrtab), *sizes.values()]
    offsets, pos = [], _EHDR.size
    for length in lengths:
        pos = (pos + 7) & ~7
        offsets.append(pos)
        pos += length
    shoff = (pos + 7) & ~7
    buffer = mmap.mmap(-1, shoff + _SHDR.size * (len(names) + 1))
    fields = list(_EHDR.unpack_from(header))
    # e_phoff, e_shoff, e_phnum, e_shentsize, e_shnum, e_shstrndx
    fields[5], fields[6], fields[10] = 0, shoff, 0
    fields[11], fields[12], fields[13] = _SHDR.size, len(names) + 1, 1
    _EHDR.pack_into(buffer, 0, *fields)
    buffer[offsets[0]:offsets[0] + len(shstrtab)] = shstrtab
    name_at = 1
    for i, (name, offset, length) in enumerate(zip(names, offsets, lengths)):
        kind = _SHT_STRTAB if i == 0 else _SHT_PROGBITS
        _SHDR.pack_into(buffer, shoff + _SHDR.size * (i + 1),
                        name_at, kind, 0, 0, offset, length, 0, 0, 1, 0)
        name_at += len(name) + 1
    return buffer, dict(zip(names[1:], offsets[1:]))
