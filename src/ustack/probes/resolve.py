"""ProbeSpec -> where the kernel puts the probe: uprobe file offsets (on an
instruction boundary, with the return-address slot the unwinder needs) and
tracepoint names expanded from globs (probes/tracepoints.py)."""
from __future__ import annotations

from ustack.interrupt import NEVER
from ustack.model import (ProbeSpec, UprobeProbe,
                          UstackError)
from ustack.objfile import prologue
from ustack.objfile.debuginfo import debug_lookup
from ustack.objfile.elf import ElfImage, Symbol
from ustack.objfile.on_disk import OnDisk
from ustack.probes import ifunc
from ustack.probes.binaries import locate_binary, realpath_in_root  # noqa: F401 (its old home)
from ustack.probes.boundary import NotABoundary, NotProven, prove
from ustack.probes.entries import fragment_note, return_probe_refusal
from ustack.probes.fetchargs import NamedArgError, kernel_fetch_args
from ustack.probes.tracepoints import is_glob, tracepoint_probes  # noqa: F401 (its old home)
from ustack.values import replace



# --- uprobes ---------------------------------------------------------------

class Unprobeable(UstackError):
    """The kernel would refuse a uprobe on this instruction."""


class NotCalled(UstackError):
    """A return probe on code that calls do not reach (probes/entries.py)."""


def resolve_uprobes(spec: ProbeSpec, pid: int | None = None,
                    notes: list | None = None, unsafe: bool = False,
                    interrupt=NEVER) -> list:
    """The probes `spec` stands for. A glob skips the functions whose first
    instruction the kernel would refuse, saying so in `notes`. Every probe
    is on an instruction start proven from the file (probes/boundary.py);
    `unsafe` (--unsafe-address) also accepts one that cannot be proven;
    `interrupt` is heard between two functions (a libc glob takes ~1 s)."""
    if spec.kind not in ("uprobe", "uretprobe"):
        raise ValueError(f"not a uprobe spec: {spec.kind}")
    host, shown = locate_binary(spec.path, pid)
    image = ElfImage.open(host)
    # a stripped object's local functions (libc's new_do_write): its debug file's
    debug = None if image.file.has_symtab else debug_lookup(image)[0]
    if spec.address is not None:
        sym = image.symbols.lookup(spec.address)
        if sym is None and debug is not None:
            sym = debug.symbols.lookup(spec.address)
        places = [(sym, spec.address)]
    else:
        places = [(s, s.address + spec.offset)
                  for s in _functions(image, debug, spec.function, shown, spec.offset,
                                      notes)]
    targets = []
    for sym, vaddr in places:
        interrupt.check()
        if spec.kind == "uretprobe" and sym is not None and vaddr != sym.address:
            # the kernel would overwrite [sp], which is no return address here
            raise UstackError(f"a uretprobe must be on a function's entry, and "
                              f"0x{vaddr:x} is {sym.name}+0x{vaddr - sym.address:x}")
        try:
            if spec.kind == "uretprobe" and image.file.is_go:
                targets.extend(_go_returns(spec, image, host, shown, sym, vaddr, notes))
            elif image.file.is_go and sym is not None and vaddr == sym.address:
                targets.append(_go_entry(spec, image, host, shown, sym))
            else:
                probe = probe_at(spec, image, host, shown, sym, vaddr, debug, unsafe)
                targets.append(probe)
                note = fragment_note(OnDisk.of(host), vaddr, probe.symbol, probe.label)
                if note and notes is not None:
                    notes.append(note)
        except (Unprobeable, NamedArgError, NotABoundary, NotProven, NotCalled) as e:
            if not is_glob(spec.function or ""):
                raise
            if notes is not None:
                notes.append(f"skipped: {e}")
    if not targets:
        raise UstackError(f"no function matching '{spec.function}' in {shown} "
                          "can be probed")
    return targets


def _go_entry(spec, image, host, shown, sym) -> UprobeProbe:
    """A uprobe on a Go function's entry, placed after its stack-growth
    check (as Delve places a breakpoint): when runtime.morestack grows the
    stack, or a preemption request takes that path, the function runs again
    from its first instruction, and a probe there would count one call
    twice. Named as the function, as the user gave it."""
    from ustack.probes.return_sites import entry_site      # Go only: capstone
    probe = probe_at(spec, image, host, shown, sym, entry_site(image, sym))
    return replace(probe, label=f"{spec.kind}:{shown}:{sym.name}")


def _go_returns(spec, image, host, shown, sym, vaddr, notes) -> list:
    """A uretprobe on a Go function, made safe: a uprobe on each of its RET
    instructions (a uretprobe's trampoline crashes Go, which moves stacks
    and checks the return addresses on them), named as the uretprobe;
    `$retval` is rax there (Go's first result register)."""
    if sym is None:
        raise UstackError(f"uretprobe on Go code at 0x{vaddr:x} needs a function: "
                          "its return instructions are found from its bounds")
    entry = probe_at(replace(spec, kind="uprobe", args=()), image, host,
                     shown, sym, vaddr)
    from ustack.probes.return_sites import return_probes    # Go returns only
    rets, tails = return_probes(entry, image, label=f"uretprobe:{shown}:{sym.name}")
    args = tuple(w.replace("$retval", "%ax") for w in
                 kernel_fetch_args(spec.args, image.file.is_go, spec.text))
    if tails and notes is not None:
        notes.append(f"{sym.name} leaves through tail calls too; the returns of "
                     "those calls are not seen")
    spec = replace(spec, kind="uprobe")     # for the kernel: plain uprobes
    return [replace(p, spec=spec, fetch_args=args) for p in rets]


def _functions(image: ElfImage, debug, func: str, shown: str, offset: int = 0,
               notes: list | None = None) -> list:
    """The functions FUNC names, one per address (aliases share one probe):
    also those only a separate debug file names (a stripped libc's
    new_do_write); a symbol's default version over old ones (memcpy@@
    GLIBC_2.14, not the compat memcpy@GLIBC_2.2.5); an IFUNC as the
    implementation it resolves to here (strlen: __strlen_avx2). `debug`:
    the debug file's ElfImage, for a stripped image."""
    found = [(s, image) for s in image.symbols.match(func)]
    if debug is not None:
        found += [(s, debug) for s in debug.symbols.match(func)]
    if not found:
        raise no_function_error(image, func, shown)
    defaults = {s.name for s, where in found if not where.is_compat(s)}
    by_addr: dict = {}
    for s, where in found:
        if where.is_compat(s) and s.name in defaults:
            continue
        if where.is_ifunc(s):
            if is_glob(func) and not offset:
                # one IFUNC a glob cannot probe (time resolves to the vDSO)
                # must not fail the run: skipped with a note
                vaddr = ifunc.implementation(image, s.name)
                if vaddr is None or image.file.file_offset(vaddr) is None:
                    if notes is not None:
                        notes.append(f"skipped: {s.name} in {shown} is an IFUNC whose "
                                     f"code is not in {shown} here (the vDSO's, or "
                                     "chosen where ustack cannot see)")
                    continue
            s = _ifunc_implementation(image, debug, s, shown, offset)
        best = image.symbols.lookup(s.address) or (debug.symbols.lookup(s.address) if debug else None)
        if s.address not in by_addr or (best is not None and s.name == best.name):
            by_addr[s.address] = s
    return [by_addr[a] for a in sorted(by_addr)]


def _ifunc_implementation(image: ElfImage, debug, sym: Symbol, shown: str,
                          offset: int) -> Symbol:
    """The function an IFUNC resolves to on this machine (see ifunc.py)."""
    def hint() -> str:              # for the errors only: it scans every function
        candidates = sorted({s.name for s in (debug or image).functions
                             if sym.name in s.name and s.name != sym.name})[:6]
        return f"; its implementations: {', '.join(candidates)}" if candidates else ""
    if offset:
        raise UstackError(f"{sym.name} in {shown} is an IFUNC (the code it runs is "
                          f"chosen at load time): probe an implementation by name"
                          f" with +0x{offset:x}{hint()}")
    vaddr = ifunc.implementation(image, sym.name)
    if vaddr is None:
        raise UstackError(f"{sym.name} in {shown} is an IFUNC (the code it runs is "
                          "chosen at load time) and ustack resolves those only in "
                          "libraries it has loaded itself: probe an implementation "
                          f"by name{hint()}")
    named = (debug.symbols.lookup(vaddr) if debug else None) or image.symbols.lookup(vaddr)
    if named is not None and named.address == vaddr:
        return named
    return Symbol(f"{sym.name}@0x{vaddr:x}", vaddr, 0)


def no_function_error(image: ElfImage, func: str, shown: str) -> UstackError:
    if is_glob(func) and func not in (s.name for s in image.symbols.functions):
        return UstackError(f"no function matches '{func}' in {shown}")
    msg = f"no function '{func}' in {shown}"
    overloads = image.symbols.overloads(func)
    if len(overloads) > 1:
        return UstackError(f"'{func}' is ambiguous in {shown}: {', '.join(overloads)}; "
                           "probe one by its full name")
    if not image.symbols.functions:
        why = f"; {image.file.go_error}" if image.file.go_error else ""
        return UstackError(f"{msg} ({shown} has no symbol table{why})")
    near = near_names(image, func)
    return UstackError(f"{msg}; did you mean: {', '.join(near)}?" if near else msg)


def near_names(image: ElfImage, func: str) -> list:
    """Up to five function names close to `func`, as a user would type
    them: C names as they are, C++ and Rust ones demangled without their
    parameters (`shop::Counter::add`), found also by their last parts
    (`Counter::ad`, `addd`)."""
    import difflib
    from ..objfile.demangle import demangle, is_mangled, plain_name
    keys: dict = {}                      # what may be near -> the name to suggest
    for sym in image.symbols.functions:
        keys.setdefault(sym.name, sym.name)
        if is_mangled(sym.name):
            shown = plain_name(demangle(sym.name))
            parts = shown.split("::")
            for i in range(len(parts)):
                keys.setdefault("::".join(parts[i:]), shown)
    near = difflib.get_close_matches(func, sorted(keys), n=5)
    return list(dict.fromkeys(keys[k] for k in near))


def probe_at(spec, image, host, shown, sym: Symbol | None, vaddr: int,
             debug=None, unsafe: bool = False) -> UprobeProbe:
    """A uprobe at vaddr of `host` (in function `sym`), proven to be an
    instruction start the kernel can probe, with `spec`'s arguments."""
    sym_off = vaddr - sym.address if sym else 0
    if sym is None:
        where = f"0x{vaddr:x}"
    else:
        where = f"{sym.name}+0x{sym_off:x}" if sym_off else sym.name
    if sym is not None and sym_off and sym_off >= sym.size:
        raise UstackError(f"{where} is beyond the end of {sym.name} "
                          f"(size 0x{sym.size:x}) in {shown}")
    proof = prove(image, host, vaddr, where, shown, spec.kind, sym, debug, unsafe)
    if spec.kind == "uretprobe" and proof.starts and vaddr not in proof.starts:
        # (the symbol check in resolve_uprobes, for code no symbol covers)
        raise UstackError(f"a uretprobe must be on a function's entry, and {where} "
                          f"in {shown} is inside the function at 0x{max(proof.starts):x}")
    if spec.kind == "uretprobe":
        refusal = return_probe_refusal(OnDisk.of(host), vaddr, sym.name if sym else None)
        if refusal:
            raise NotCalled(f"no uretprobe at {where} in {shown}: {refusal}")
    _refuse_unprobeable(OnDisk.of(host).code(vaddr, vaddr + 15), vaddr, where, shown, sym)
    slot = _return_address_slot(proof, vaddr)
    args, kinds = (), ()
    if spec.args:
        from ustack.probes.named_args import resolve_args       # DWARF: only for args
        fp_cfa = None
        if slot is None and proof.start is not None:
            fp_cfa = prologue.frame_pointer_cfa(proof.code, proof.start, vaddr)
        args, kinds = resolve_args(spec.args, image, shown, sym.name if sym else where,
                                   where, vaddr, spec.kind, slot, fp_cfa)
    if spec.kind != "uprobe":
        # a uretprobe fires after the return: its caller's frame is the
        # top of the walk and no word on the stack is missing from it
        slot = None
    return UprobeProbe(spec=spec, path=host, file_offset=proof.file_offset, address=vaddr,
                        symbol=sym.name if sym else None, symbol_offset=sym_off,
                        return_address_slot=slot, label=f"{spec.kind}:{shown}:{where}",
                        fetch_args=kernel_fetch_args(args, image.file.is_go, spec.text),
                        arg_kinds=kinds)


# --- disassembly: instruction boundary and the return-address slot ----------

# Legacy prefixes the kernel's x86 uprobes refuse (is_prefix_bad() in
# arch/x86/kernel/uprobes.c): lock and the ES/CS/DS/SS segment overrides
# (0x3e is also `notrack`). With -c the refusal happens silently at exec,
# with -p as error 524 (ENOTSUPP), so it is checked here, before any run.
_LEGACY_PREFIXES = frozenset(b"\xf0\xf2\xf3\x2e\x36\x3e\x26\x64\x65\x66\x67")
_REFUSED_PREFIXES = {0xF0: "lock", 0x26: "segment (es)", 0x2E: "segment (cs)",
                     0x36: "segment (ss)", 0x3E: "segment (ds) or notrack"}


# In 64-bit mode a first byte 0xC4/0xC5 starts a VEX (AVX) prefix, 0x62 an
# EVEX (AVX-512) one. The kernel's uprobes judge such an instruction by the
# opcode byte after the prefix as if it had none: it refuses some (with -c
# silently: 0 hits) and runs others as that other instruction (EVEX
# vpbroadcastb's 0x7a is taken for a jp: libc's memset then wrote zeros,
# under perf and bpftrace alike).
_VECTOR_PREFIXES = {0xC4: "VEX-encoded (AVX)", 0xC5: "VEX-encoded (AVX)",
                    0x62: "EVEX-encoded (AVX-512)"}


def _refuse_unprobeable(code: bytes, vaddr: int, where: str, shown: str, sym) -> None:
    """Refuse a probe site the kernel refuses (lock and segment prefixes)
    or would mistake for another instruction (VEX, EVEX), with the next
    instruction suggested. `code`: the file's bytes from vaddr on."""
    code = code[:15]
    why = None
    for byte in code:
        if byte in _REFUSED_PREFIXES:
            why = f"has a {_REFUSED_PREFIXES[byte]} prefix, which x86 uprobes refuse"
            break
        if byte not in _LEGACY_PREFIXES:
            if byte in _VECTOR_PREFIXES:
                why = (f"is {_VECTOR_PREFIXES[byte]}, which x86 uprobes take for "
                       "another instruction (refused, or stepped wrongly)")
            break
    if why is None:
        return
    insn = next(iter(prologue.instructions(code, vaddr)), None)
    text = f"'{insn.mnemonic} {insn.op_str}'" if insn else "its instruction"
    hint = ""
    if insn is not None and sym is not None:
        hint = f"; probe the next instruction, {sym.name}+0x{vaddr + insn.size - sym.address:x}"
    raise Unprobeable(f"the kernel cannot place a uprobe at {where} in {shown}: "
                      f"{text} {why}{hint}")


def _return_address_slot(proof, vaddr: int):
    """Words between sp and the return address at vaddr, counted from the
    proven function start (see prologue.return_address_slot); None when
    no start is known."""
    if proof.start is None:
        return None
    if vaddr == proof.start:
        return 0  # nothing pushed yet: the return address is at [sp]
    prefix = list(prologue.instructions(proof.code[: vaddr - proof.start], proof.start))
    return prologue.return_address_slot(prefix, proof.code, proof.start, vaddr)


