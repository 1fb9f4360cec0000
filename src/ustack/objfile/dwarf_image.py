"""An ELF image in memory holding only the DWARF sections libdw reads for
file:line and inlined calls, already inflated, for kernel.libdw to open
instead of the file.

Why: libdw 0.188's dwarf_begin inflates every compressed .debug_* section
of the file, one after the other, with zlib: ~40 ms for libc's debug file,
most of a cold eu-addr2line run. Here only the sections below are
inflated (not .debug_loclists, .debug_frame, .debug_macro, ...), by
libdeflate when installed (objfile.inflate), the largest in a second
thread: ~9 ms. The image is memory only (~9 MB for libc), never written to
disk: a cold run stays cold.

Only ELF64 little-endian files with SHF_COMPRESSED DWARF and no dwz alt
file get an image; others are opened by libdw as before."""
from __future__ import annotations

import struct
import threading
from typing import Optional

from ..model import UstackError
from .elf import ElfImage

# What dwarf_addrdie, dwarf_getsrc_die, dwarf_getscopes(_die) and the
# attribute/string calls of kernel.libdw read: unit lookup (.debug_aranges),
# DIEs and their abbreviations, line programs, strings in all three DWARF 5
# forms, address and range lists. Checked against eu-addr2line on libc
# (tests/test_lines.py).
SECTIONS = (".debug_info", ".debug_abbrev", ".debug_aranges", ".debug_line",
            ".debug_line_str", ".debug_str", ".debug_str_offsets", ".debug_addr",
            ".debug_ranges", ".debug_rnglists", ".debug_types")

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")     # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")           # Elf64_Shdr
_SHT_PROGBITS, _SHT_STRTAB = 1, 3
_ELFCLASS64, _ELFDATA2LSB = 2, 1


def wanted(image: ElfImage) -> bool:
    """Whether an image saves libdw work: some DWARF section is compressed
    (an uncompressed file is mapped by libdw as it is)."""
    return (image.little_endian and image.elfclass == 64
            and ".gnu_debugaltlink" not in image.section_names
            and not any(n.startswith(".zdebug") for n in image.section_names)
            and any(image.is_compressed(n) for n in image.section_names
                    if n.startswith(".debug_")))


def build(image: ElfImage) -> Optional[bytearray]:
    """The image of `image`'s SECTIONS, inflated; None when wanted() is
    False or a section cannot be read (libdw then opens the file and says
    what is wrong)."""
    if not wanted(image):
        return None
    raw = {n: image.section_file_bytes(n) for n in SECTIONS if n in image.section_names}
    raw = {n: data for n, data in raw.items() if data}
    try:
        contents = _inflated(image, raw)
    except UstackError:
        return None
    header = image.file_bytes(0, _EHDR.size)
    return _elf_image(header, contents)


def _inflated(image: ElfImage, raw: dict) -> dict:
    """{name: contents}: the largest section inflated in a thread while
    this one inflates the rest (libdeflate and zlib let go of the GIL)."""
    names = sorted(raw, key=lambda n: len(raw[n]), reverse=True)
    out: dict = {}
    failed: list = []

    def run(group):
        try:
            for name in group:
                out[name] = image.inflated(name, raw[name])
        except UstackError as e:
            failed.append(e)

    thread = None
    if len(names) > 1:
        thread = threading.Thread(target=run, args=(names[:1],), daemon=True)
        thread.start()
        names = names[1:]
    run(names)
    if thread is not None:
        thread.join()
    if failed:
        raise failed[0]
    return out


def _elf_image(header: bytes, contents: dict) -> bytearray:
    """ELF header, section contents, then the section header table:
    [0] null, [1] .shstrtab, then one SHT_PROGBITS section per entry."""
    names = [".shstrtab", *contents]
    shstrtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    blobs = [shstrtab, *contents.values()]
    offsets, pos = [], _EHDR.size
    for blob in blobs:
        pos = (pos + 7) & ~7
        offsets.append(pos)
        pos += len(blob)
    shoff = (pos + 7) & ~7
    out = bytearray(shoff + _SHDR.size * (len(blobs) + 1))
    fields = list(_EHDR.unpack_from(header))
    # e_phoff, e_shoff, e_phnum, e_shentsize, e_shnum, e_shstrndx
    fields[5], fields[6], fields[10] = 0, shoff, 0
    fields[11], fields[12], fields[13] = _SHDR.size, len(blobs) + 1, 1
    _EHDR.pack_into(out, 0, *fields)
    name_at = 1
    for i, (name, blob, off) in enumerate(zip(names, blobs, offsets)):
        out[off:off + len(blob)] = blob
        kind = _SHT_STRTAB if i == 0 else _SHT_PROGBITS
        _SHDR.pack_into(out, shoff + _SHDR.size * (i + 1),
                        name_at, kind, 0, 0, off, len(blob), 0, 0, 1, 0)
        name_at += len(name) + 1
    return out
