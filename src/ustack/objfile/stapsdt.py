"""USDT probes: the notes `<sys/sdt.h>` leaves in `.note.stapsdt`, one per
probe site (SystemTap's format, https://sourceware.org/systemtap/wiki/
UserSpaceProbeImplementation): the site's address (a nop), the address of
`.stapsdt.base` when the note was written, the semaphore's address (0: none),
then provider, name and the argument specs ("-4@%edx 8@16(%rsp)").

A tool that moved sections (prelink) after the notes were written shifts the
addresses: each is corrected by (.stapsdt.base's address now - the note's
base), as SystemTap and bpftrace do. Notes are framed by pyelftools; their
contents are decoded here (pyelftools leaves NT_STAPSDT as bytes)."""
from __future__ import annotations

import struct

from ..model import UstackError
from ..values import value

# NT_STAPSDT is 3, which pyelftools names as NT_GNU_BUILD_ID (its number
# in GNU notes): the owner "stapsdt" tells them apart
_NT_STAPSDT = (3, "NT_GNU_BUILD_ID")


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
    file without `.note.stapsdt`."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            notes = elf.get_section_by_name(".note.stapsdt")
            if notes is None:
                return []
            base_sec = elf.get_section_by_name(".stapsdt.base")
            base = base_sec["sh_addr"] if base_sec is not None else None
            word = struct.Struct(("<" if elf.little_endian else ">")
                                 + ("QQQ" if elf.elfclass == 64 else "III"))
            return [_decode(n["n_descdata"], word, base, path)
                    for n in notes.iter_notes()
                    if n["n_name"] == "stapsdt" and n["n_type"] in _NT_STAPSDT]
    except (ELFError, OSError, struct.error, UnicodeDecodeError) as e:
        raise UstackError(f"{path}: cannot read its USDT notes: {e}") from None


def _decode(desc: bytes, word: struct.Struct, base: int | None, path: str) -> SdtProbe:
    pc, note_base, sem = word.unpack_from(desc)
    strings = bytes(desc[word.size:]).split(b"\0")
    if len(strings) < 3:
        raise UstackError(f"{path}: a truncated USDT note")
    provider, name, args = (s.decode() for s in strings[:3])
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
    except (ELFError, OSError) as e:
        raise UstackError(f"{path}: cannot read its symbols: {e}") from None
    return None
