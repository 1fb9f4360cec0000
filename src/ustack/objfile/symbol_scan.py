"""The function at an address of an object whose whole function table a
child is still building (objfile/function_builder.py: node's 86,000
functions, ~1.3 s of CPU, 4-8 s of wall time on a busy machine, which a
cold whole-machine run waited for at its end): found from the symbol
tables' entries, indexed once by address (~0.15 s for node), with only
the names of the entries that can own the address decoded.

It names an address exactly as the whole table (ElfSymbols.lookup) does:
the same entries enter (elf_symtab.add_function, in the same order), and
the same ranking of aliases, filling of zero sizes and innermost-range
rule choose (ElfSymbols.built, given every function start of the file),
over every entry that can own the address:
  - the entries at the greatest function start at or below it (a zero
    size is filled to the next start, so no earlier zero-sized entry
    reaches it);
  - the sized entries whose range holds it, and every alias at their
    addresses (the alias ranked first gives the range);
  - for a code label among those, the sized entries holding the label's
    address (a label inside a function is no owner)."""
from __future__ import annotations

import bisect
from itertools import accumulate, compress
from operator import add

from ..interrupt import current
from .elf_symbols import ElfSymbols
from .elf_symtab import (FUNC_TYPES, SHF_EXECINSTR, STT_NOTYPE,
                         SYMBOL_TABLES, ReadOnce, add_function, hidden_versions, name_at,
                         plt_functions, symbol_entries)


class _Names:
    """A symbol table's entries as plt_functions reads them: [index][0] is
    the entry's name, decoded when asked."""

    def __init__(self, entries: list, text: str):
        self.entries, self.text = entries, text

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> tuple:
        return (name_at(self.text, self.entries[i][0]),)


class SymbolScan:
    """lookup() as the whole ElfSymbols of the file at `path` answers."""

    def __init__(self, path: str):
        from .elf_reader import open_reader
        with open(path, "rb") as f:
            reader = open_reader(path, f)
            try:
                self._index(ReadOnce(reader))
            finally:
                reader.close()

    def _index(self, reader) -> None:
        interrupt = current()
        sections = self._sections = reader.sections
        code = {s.index for s in sections if s.flags & SHF_EXECINSTR}
        self._tables = []               # (entries, string table text, hidden versions)
        addrs, refs, sizes = [], [], []     # of each entry add_function would enter
        names = {}
        for sec in sections:
            if sec.type not in SYMBOL_TABLES:
                continue
            entries, strtab = symbol_entries(reader, sec)
            text = strtab.decode("latin-1")     # as elf_symtab decodes names
            table = len(self._tables) << 32
            self._tables.append((entries, text, hidden_versions(reader, sec)))
            names[sec.index] = _Names(entries, text)
            end = len(strtab)
            # what elf_symtab.add_function enters, judged without names, in
            # one loop without calls: node's 185,000 entries
            for i, (n, v, size, info, shndx) in enumerate(entries):
                if not i & 0x3FFF:
                    interrupt.check()   # a run asked to end ends now (node: ~0.3 s here)
                if not v or not shndx or n >= end or not strtab[n]:
                    continue
                kind = info & 0xF
                if kind in FUNC_TYPES or (kind == STT_NOTYPE and shndx in code):
                    addrs.append(v)
                    refs.append(table | i)
                    sizes.append(size)
        plt = plt_functions(reader, names)
        self._plt = {}                  # address -> its PLT stubs' raw entries
        for key, v in plt.items():
            self._plt.setdefault(key[0], {})[key] = v
        for (a, _), v in plt.items():
            addrs.append(a)
            refs.append(-1)             # not a table's entry: self._plt holds it
            sizes.append(v[0])
        # in address order, then table order (sorted() is stable): by C calls
        order = sorted(range(len(addrs)), key=addrs.__getitem__)
        self._addrs = list(map(addrs.__getitem__, order))
        self._refs = list(map(refs.__getitem__, order))
        self._starts = list(dict.fromkeys(self._addrs))     # sorted already: duplicates out
        sizes = list(map(sizes.__getitem__, order))
        self._sized_starts = list(compress(self._addrs, sizes))
        self._sized_ends = ends = list(map(add, self._sized_starts, filter(None, sizes)))
        self._reach = list(accumulate(ends, max))   # the furthest end up to each

    def _refs_at(self, address: int) -> list:
        """(table, entry index) of the table entries at `address`, in table order."""
        lo = bisect.bisect_left(self._addrs, address)
        hi = bisect.bisect_right(self._addrs, address, lo)
        return [(r >> 32, r & 0xFFFFFFFF) for r in self._refs[lo:hi] if r >= 0]

    def lookup(self, vaddr: int):
        """The Symbol ElfSymbols.lookup(vaddr) gives, or None."""
        owners: set = set()
        self._starts_owning(vaddr, owners)
        for address in list(owners):
            if any(self._tables[t][0][i][3] & 0xF == STT_NOTYPE for t, i in self._refs_at(address)):
                self._holding(address, owners)      # what may hide the label
        raw = {key: v for a in owners for key, v in self._plt.get(a, {}).items()}
        for t, i in sorted(ref for a in owners for ref in self._refs_at(a)):
            entries, text, hidden = self._tables[t]
            n, v, size, info, shndx = entries[i]
            add_function(raw, self._sections, hidden, i, name_at(text, n), v, size, info,
                         shndx)
        return ElfSymbols.built(raw, self._sections, starts=self._starts).lookup(vaddr)

    def _starts_owning(self, vaddr: int, out: set) -> None:
        """The addresses of the entries that can own vaddr."""
        i = bisect.bisect_right(self._starts, vaddr) - 1
        if i >= 0:
            out.add(self._starts[i])
        self._holding(vaddr, out)

    def _holding(self, vaddr: int, out: set) -> None:
        """The addresses of the sized entries whose range holds vaddr."""
        starts, ends, reach = self._sized_starts, self._sized_ends, self._reach
        j = bisect.bisect_right(starts, vaddr) - 1
        while j >= 0 and reach[j] > vaddr:
            if ends[j] > vaddr:
                out.add(starts[j])
            j -= 1
