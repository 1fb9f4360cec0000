"""`ustack list BINARY [PATTERN] [-v]`: the functions a uprobe can be put
on; with -v each one's parameters and types from DWARF, as `bpftrace -lv`
prints them (and the type of `$retval`)."""
from __future__ import annotations

import sys
from typing import NamedTuple

from ustack.probes.binaries import locate_binary
from ustack.objfile.demangle import demangle
from ustack.objfile.dwarf_params import DamagedDwarf, DwarfParams
from ustack.objfile.elf import ElfImage
from ustack.model import printable


class FunctionRow(NamedTuple):
    name: str
    address: int
    file_offset: int | None
    size: int


def main(args) -> int:
    """`ustack list` from its parsed arguments."""
    text = list_text(args.binary, args.pattern, args.verbose)
    # names are the binary's: whoever built it chose them
    sys.stdout.write("\n".join(printable(line) for line in text.split("\n")))
    return 0


def list_functions(path: str, glob: str | None = None) -> list:
    host, shown = locate_binary(path)
    return _rows(ElfImage.open(host), glob, shown)


def _rows(image: ElfImage, glob: str | None, shown: str) -> list:
    syms = image.symbols.functions if glob is None else image.symbols.match(glob)
    if glob is not None and not syms:
        from ustack.probes.resolve import no_function_error    # its near names
        raise no_function_error(image, glob, shown)
    return [FunctionRow(demangle(s.name), s.address, image.file.file_offset(s.address), s.size)
            for s in syms]


def format_listing(rows) -> str:
    header = ("ADDRESS", "OFFSET", "SIZE")
    cells = [(f"{r.address:x}", "-" if r.file_offset is None else f"{r.file_offset:x}",
              f"{r.size:x}") for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(header)]

    def line(nums, name):
        return "  ".join(n.rjust(w) for n, w in zip(nums, widths)) + "  " + name

    return "\n".join([line(header, "FUNCTION")]
                     + [line(c, r.name) for c, r in zip(cells, rows)]) + "\n"


def format_params(path: str, glob: str | None = None) -> str:
    """`uprobe:PATH:FUNC` and, indented, each parameter as `TYPE NAME`
    (bpftrace -lv's layout), then `TYPE $retval` when it returns a value;
    functions DWARF does not describe get the first line only, and so do
    those whose DWARF is damaged (said once, on stderr)."""
    host, shown = locate_binary(path)
    image = ElfImage.open(host)
    params = DwarfParams.for_image(image)
    out = []
    damaged: list = []
    for row in _rows(image, glob, shown):
        out.append(f"uprobe:{shown}:{row.name}\n")
        try:
            info = params.function_at(row.address) if params is not None else None
        except DamagedDwarf as e:
            damaged.append(e)
            continue
        if info is None:
            continue
        out += [f"    {p.type.name} {p.name}\n".replace("  \n", "\n") for p in info.params]
        if info.returns is not None and not image.file.is_go:   # Go lists its ~r0
            out.append(f"    {info.returns.name} $retval\n")
    if damaged:
        sys.stderr.write(f"ustack: {damaged[0]} (not shown for {len(damaged)} "
                         f"function{'s' if len(damaged) > 1 else ''})\n")
    return "".join(out)


def list_text(path: str, pattern: str | None, verbose: bool) -> str:
    """What `ustack list` prints: the functions, then the binary's USDT
    probes under their own heading; a pattern `usdt:GLOB` lists only the
    USDT probes whose PROVIDER:NAME or NAME matches."""
    if pattern is not None and pattern.startswith("usdt:"):
        text = format_usdt(path, pattern[len("usdt:"):] or "*")
        if not text:
            from ustack.probes.usdt import resolve_usdt   # its one-line errors
            from ustack.probes.spec import parse_event
            resolve_usdt(parse_event(f"usdt:{path}:{pattern[len('usdt:'):]}"))
        return text
    text = (format_params(path, pattern) if verbose
            else format_listing(list_functions(path, pattern)))
    usdt = format_usdt(path) if pattern is None else ""
    return text + ("\n" + usdt if usdt else "")


def format_usdt(path: str, glob: str = "*") -> str:
    """`PROVIDER:NAME  ARGUMENTS` per USDT probe (one line for all its
    sites), under a USDT heading; "" when none matches."""
    import fnmatch
    from ustack.objfile.stapsdt import sdt_probes
    host, _shown = locate_binary(path)
    rows = {}
    for p in sdt_probes(host):
        name = f"{p.provider}:{p.name}"
        if fnmatch.fnmatchcase(name, glob) or fnmatch.fnmatchcase(p.name, glob):
            rows.setdefault(name, (p.args, 0))
            rows[name] = (rows[name][0], rows[name][1] + 1)
    if not rows:
        return ""
    width = max(len(n) for n in rows)
    lines = ["USDT PROBE".ljust(width) + "  SITES  ARGUMENTS"]
    lines += [f"{n.ljust(width)}  {sites:5d}  {args}".rstrip()
              for n, (args, sites) in rows.items()]
    return "\n".join(lines) + "\n"
