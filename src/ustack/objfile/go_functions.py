"""A stripped Go binary's functions, from .gopclntab (which -s -w keeps),
as raw functions (objfile.elf_symtab's shape)."""
from __future__ import annotations


def go_functions(file) -> dict:
    """(entry, name) -> (size, binding, section, flags) of `file`'s Go
    functions (an ElfFile); why its table is unusable goes to file.go_error."""
    from .gopclntab import PclntabError, go_table
    try:
        table = go_table(file)
    except PclntabError as e:
        file.go_error = str(e)
        return {}
    return {(entry, name): (end - entry, "STB_GLOBAL", None, 0)
            for name, entry, end in table.functions()} if table else {}
