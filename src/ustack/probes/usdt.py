"""`usdt:PATH:PROVIDER:NAME` -> a uprobe on each site of the probe
(objfile.stapsdt), each proven an instruction start like any uprobe, with
its semaphore as the kernel's reference counter, and the arguments the
user names (`arg0`, `arg1:string`, `fn=arg1:string`) as fetch-args from
the note's argument specs (probes/usdt_args.py)."""
from __future__ import annotations

import difflib
import fnmatch
import re

from ..model import UprobeProbe, UstackError
from ..objfile.debuginfo import debug_lookup
from ..objfile.elf import ElfImage
from ..objfile.stapsdt import sdt_probes, symbol_address
from ..values import replace
from .fetchargs import display_kinds, kernel_fetch_args
from .binaries import locate_binary
from .resolve import is_glob, probe_at
from .usdt_args import usdt_fetch

_ARG = re.compile(r"arg([0-9]+)")


def resolve_usdt(spec, pid: int | None = None, notes: list | None = None) -> list:
    """A UprobeProbe per site of every probe `spec` names, labelled
    usdt:PATH:PROVIDER:NAME. A glob skips the probes that lack an argument
    asked for, saying so in `notes`."""
    host, shown = locate_binary(spec.path, pid)
    found = sdt_probes(host)
    if not found:
        raise UstackError(f"{shown} has no USDT probes (no .note.stapsdt section)")
    sites = [p for p in found if fnmatch.fnmatchcase(p.name, spec.name)
             and (spec.provider is None or fnmatch.fnmatchcase(p.provider, spec.provider))]
    if not sites:
        raise _no_probe(spec, found, shown)
    image = ElfImage.open(host)
    debug = None if image.has_symtab else debug_lookup(image)[0]
    plain = replace(spec, kind="uprobe", args=())       # for the kernel: a uprobe
    probes = []
    for site in sites:
        label = f"usdt:{shown}:{site.provider}:{site.name}"
        try:
            args, kinds = _args(spec.args, site, f"{site.provider}:{site.name}",
                                _global_at(host, image, site.pc))
        except UstackError as e:
            if not is_glob(f"{spec.provider}:{spec.name}"):
                raise
            if notes is not None and f"skipped: {e}" not in notes:
                notes.append(f"skipped: {e}")     # once for all its sites
            continue
        sym = image.lookup(site.pc) or (debug.lookup(site.pc) if debug else None)
        probe = probe_at(plain, image, host, shown, sym, site.pc, debug)
        ref_ctr = 0
        if site.semaphore:
            ref_ctr = image.file_offset(site.semaphore)
            if ref_ctr is None:
                raise UstackError(f"USDT probe {label}: its semaphore at "
                                  f"0x{site.semaphore:x} is not in the file")
        probes.append(replace(probe, spec=replace(plain, args=args), label=label,
                              fetch_args=kernel_fetch_args(args, False, spec.text),
                              arg_kinds=kinds, ref_ctr_offset=ref_ctr))
    if not probes:
        raise UstackError(f"no USDT probe matching '{spec.text.split()[0]}' has "
                          "every argument asked for")
    return probes


def _global_at(host: str, image, pc: int):
    """symbol -> the @+OFFSET that reaches it from a probe at `pc`: the
    kernel (and the BPF fetch) add it to where the probe's file offset 0
    is mapped, reckoned from the probe's own segment, so it is the symbol's
    distance from pc plus pc's file offset."""
    def at(name: str) -> int | None:
        vaddr = symbol_address(host, name)
        pc_off = image.file_offset(pc)
        return None if vaddr is None or pc_off is None else vaddr - pc + pc_off
    return at


def _args(wanted: tuple, site, name: str, global_at=None) -> tuple:
    """(the kernel's (name, fetch, type) triples, ((name, display kind), …))
    for the user's words: `argN` is the note's N-th argument, read as a
    string with `:string`, in the user's type with another; kernel fetches
    (%di, +8(%sp)) pass as they are."""
    specs = site.arg_specs
    out, kinds = [], {}
    for arg_name, fetch, typ in wanted:
        m = _ARG.fullmatch(fetch)
        if m is None and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fetch):
            raise UstackError(f"USDT probe {name} has no argument '{fetch}'; "
                              f"{_have(specs)}")
        if m is not None:
            n = int(m.group(1))
            if n >= len(specs):
                raise UstackError(f"USDT probe {name} has no argument {fetch}; "
                                  f"{_have(specs)}")
            fetch, own = usdt_fetch(specs[n], name, global_at)
            if typ in ("string", "ustring"):
                fetch = f"+0({fetch})"
            elif not typ:
                typ = own
        out.append((arg_name, fetch, typ))
        kinds.update(display_kinds(((arg_name, fetch, typ),)))
    return tuple(out), tuple(kinds.items())


def _have(specs: tuple) -> str:
    if not specs:
        return "it has no arguments"
    if len(specs) == 1:
        return "its argument: arg0"
    return f"its arguments: arg0…arg{len(specs) - 1}"


def _no_probe(spec, found: list, shown: str) -> UstackError:
    wanted = spec.name if spec.provider is None else f"{spec.provider}:{spec.name}"
    names = sorted({f"{p.provider}:{p.name}" for p in found})
    msg = f"no USDT probe '{wanted}' in {shown}"
    pool = names if spec.provider is not None else sorted({p.name for p in found})
    near = difflib.get_close_matches(wanted, pool, n=5, cutoff=0.75)
    if near:
        return UstackError(f"{msg}; did you mean: {', '.join(near)}?")
    return UstackError(f"{msg}; it has: {', '.join(names[:8])}"
                       + (", …" if len(names) > 8 else ""))
