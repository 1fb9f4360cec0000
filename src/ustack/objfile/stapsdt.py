"""USDT probes: the notes `<sys/sdt.h>` leaves in `.note.stapsdt`, one per
probe site (SystemTap's format, https://sourceware.org/systemtap/wiki/
UserSpaceProbeImplementation): the site's address (a nop), the address of
`.stapsdt.base` when the note was written, the semaphore's address (0: none),
then provider, name and the argument specs ("-4@%edx 8@16(%rsp)").

A tool that moved sections (prelink) after the notes were written shifts the
addresses: each is corrected by (.stapsdt.base's address now - the note's
base), as SystemTap and bpftrace do. The section comes from objfile.elf
(bounds-checked reads); its notes are framed and decoded here, each size
checked against the section's end (pyelftools framed them, and a damaged
size sent it seeking past the file: a ValueError traceback)."""
from __future__ import annotations

import struct

from ..model import UstackError
from ..values import value

# NT_STAPSDT is 3 (NT_GNU_BUILD_ID's number in GNU notes): the owner
# "stapsdt" tells them apart
_NT_STAPSDT = 3


@value
class SdtProbe:
    provider: str
    name: str
    pc: int                 # ELF virtual address of the probe site
    semaphore: int          # ELF virtual address of its semaphore, 0 for none
    args: str               # the argument specs, space-separated

    @property
    def arg_specs(self) -> tuple:
        return tuple(self.args.split())


def sdt_probes(path: str) -> list:
    """Every probe site of the ELF file at `path`, in note order; [] for a
    file without `.note.stapsdt`. A damaged note (a size past the
    section's end, a missing string) is a one-line UstackError."""
    from .elf import ElfImage
    elf = ElfImage.open(path).file
    notes = elf.section_bytes(".note.stapsdt")
    if notes is None:
        return []
    base_sec = elf.sections.get(".stapsdt.base")
    base = base_sec[0] if base_sec is not None else None
    end = "<" if elf.little_endian else ">"
    word = struct.Struct(end + ("QQQ" if elf.elfclass == 64 else "III"))
    return [_decode(desc, word, base, path)
            for name, kind, desc in _notes(notes, struct.Struct(end + "III"), path)
            if name == b"stapsdt" and kind == _NT_STAPSDT]


def _notes(data: bytes, head: struct.Struct, path: str):
    """(name, type, desc) of each note of a note section's bytes (Elf_Nhdr:
    namesz, descsz, type; name and desc each padded to 4 bytes), every
    size checked against the section's end."""
    at = 0
    while at + head.size <= len(data):
        namesz, descsz, kind = head.unpack_from(data, at)
        name_at = at + head.size
        desc_at = name_at + _padded(namesz)
        at = desc_at + _padded(descsz)
        if at > len(data):
            raise UstackError(f"{path}: a damaged USDT note (its sizes run past "
                              f".note.stapsdt's end)")
        yield bytes(data[name_at:name_at + namesz]).rstrip(b"\0"), kind, \
            bytes(data[desc_at:desc_at + descsz])


def _padded(n: int) -> int:
    return (n + 3) & ~3


def _decode(desc: bytes, word: struct.Struct, base: int | None, path: str) -> SdtProbe:
    if len(desc) < word.size:
        raise UstackError(f"{path}: a truncated USDT note")
    pc, note_base, sem = word.unpack_from(desc)
    strings = desc[word.size:].split(b"\0")
    if len(strings) < 3:
        raise UstackError(f"{path}: a truncated USDT note")
    try:
        provider, name, args = (s.decode() for s in strings[:3])
    except UnicodeDecodeError:
        raise UstackError(f"{path}: a damaged USDT note (a name that is not text)") from None
    if base is not None and note_base:
        pc += base - note_base
        if sem:
            sem += base - note_base
    return SdtProbe(provider, name, pc, sem, args)


def symbol_address(path: str, name: str) -> int | None:
    """The ELF address of the symbol `name` (a global a note's argument
    reads) in the file at `path`'s .symtab or .dynsym; None if neither has it."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for table in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(table)
                found = sec.get_symbol_by_name(name) if sec is not None else None
                if found and found[0]["st_shndx"] != "SHN_UNDEF":
                    return found[0]["st_value"]
    except (ELFError, OSError, ValueError, struct.error, UnicodeDecodeError) as e:
        # ValueError: pyelftools seeking to a damaged name's offset past the file
        raise UstackError(f"{path}: cannot read its symbols: {e}") from None
    return None
