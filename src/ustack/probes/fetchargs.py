"""Uprobe fetch-args, in the kernel's uprobe_events syntax
(Documentation/trace/uprobetracer.rst): `%di`, `%si:u32`, `+0(%si):string`,
`$stack0`, `$comm`, `len=%si:u64`, `$retval` (uretprobe only), and
`$argN`, which ustack maps to the N-th argument register of the binary's
ABI (SysV for C, Go's register ABI for Go), and parameters by name (`n`,
`len=n`, `buf:string`), which probes.named_args finds in DWARF.

Parsed here into (name, fetch, type) triples; the kernel checks the rest
(register names, nesting) and its error_log says why it refuses one."""
from __future__ import annotations

import re

from ..model import UstackError

MAX_ARGS = 128                  # the kernel's MAX_TRACE_ARGS
# ustack's own fetch-args (registers and stack words for the DWARF unwinder
# of the tracefs backend) use this prefix; users may not
RESERVED_PREFIX = "ustk_"
SYSV_ARGS = ("di", "si", "dx", "cx", "r8", "r9")
# Go's internal register ABI (Go >= 1.17) for integer arguments
GO_ARGS = ("ax", "bx", "cx", "di", "si", "r8", "r9", "r10", "r11")
WEIGHT_ARG = "weight"          # count --weight's fetch-arg, named in the kernel's record

# patterns, compiled at first use (re's own cache): most runs parse no
# fetch-args, and compiling these at import cost every run ~0.4 ms
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_TYPE = (r"(?:[usx](?:8|16|32|64)|string|ustring|char|symbol)(?:\[[0-9]+\])?"
         r"|b[0-9]+@[0-9]+/(?:8|16|32|64)")
_ARGN = r"\$arg([0-9]+)"
# a bare special variable is named after itself, not argN
_SELF_NAMED = frozenset(("$retval", "$comm"))


def parse_fetch_args(words: list, kind: str, event: str) -> tuple:
    """(name, fetch, type) for each word after the event; type '' = default."""
    if len(words) > MAX_ARGS:
        raise UstackError(f"too many fetch-args in '{event}' ({len(words)}; "
                          f"the kernel takes at most {MAX_ARGS})")
    out = []
    names = set()
    for i, word in enumerate(words, 1):
        name, eq, rest = word.partition("=")
        if not eq:
            name, rest = f"arg{i}", word      # the kernel's default name
            bare = rest.rpartition(":")[0] if ":" in rest else rest
            if re.fullmatch(_NAME, bare):
                name = bare                   # a parameter by name (named_args.py)
            elif bare in _SELF_NAMED:
                name = bare[1:]               # $retval prints as retval=, as bpftrace's
        elif not re.fullmatch(_NAME, name):
            _bad(word, event, f"'{name}' is not a valid argument name")
        if name.startswith(RESERVED_PREFIX) or name.startswith("common_") \
                or name == "__probe_ip":
            _bad(word, event, f"the name '{name}' is reserved")
        if name in names:
            _bad(word, event, f"the name '{name}' is used twice")
        names.add(name)
        fetch, colon, typ = rest.rpartition(":")
        if not colon or ")" in typ:
            fetch, typ = rest, ""
        if not fetch:
            _bad(word, event, "nothing to fetch")
        if typ and not re.fullmatch(_TYPE, typ):
            _bad(word, event, f"unknown type '{typ}' (u8…u64, s8…s64, x8…x64, "
                              "string, char, TYPE[N], bN@O/S)")
        if "$retval" in fetch and kind != "uretprobe":
            _bad(word, event, "$retval exists only for uretprobe")
        for m in re.finditer(_ARGN, fetch):
            if not 1 <= int(m.group(1)) <= len(GO_ARGS):
                _bad(word, event, f"$arg{m.group(1)}: arguments are $arg1…"
                                  f"$arg{len(GO_ARGS)}")
        out.append((name, fetch, typ))
    return tuple(out)


def kernel_fetch_args(args: tuple, is_go: bool, event: str) -> tuple:
    """The `name=fetch[:type]` words for uprobe_events, with `$argN`
    replaced by the register that holds argument N."""
    regs = GO_ARGS if is_go else SYSV_ARGS
    words = []
    for name, fetch, typ in args:
        def reg(m):
            n = int(m.group(1))
            if n > len(regs) and name == WEIGHT_ARG:   # as --weight spells it, from arg0
                raise UstackError(
                    f"--weight arg{n - 1} ({m.group(0)}): a C function's arguments "
                    f"in registers are arg0…arg{len(regs) - 1}")
            if n > len(regs):
                raise UstackError(
                    f"bad fetch-arg '{fetch}' in '{event}': C functions take "
                    f"$arg1…$arg{len(regs)} in registers; use $stackN for the rest")
            return "%" + regs[n - 1]
        words.append(f"{name}={re.sub(_ARGN, reg, fetch)}" + (f":{typ}" if typ else ""))
    return tuple(words)


def display_kinds(args: tuple) -> dict:
    """How each argument's value prints, as the kernel's print fmt does:
    'dec' for u/s types and bitfields, 'str' for strings, 'char', and
    'hex' for x types, symbols and the untyped default."""
    kinds = {}
    for name, _fetch, typ in args:
        base = typ.split("[")[0]
        if base in ("string", "ustring"):
            kinds[name] = "str"
        elif base == "char":
            kinds[name] = "char"
        elif base[:1] in ("u", "s", "b") and base != "symbol":
            kinds[name] = "dec"
        else:
            kinds[name] = "hex"
    return kinds


def probe_kinds(probe) -> dict:
    """name -> how it prints, for each fetch-arg of a resolved uprobe: what
    DWARF typed (named args), else what the user's types say."""
    return dict(probe.arg_kinds) or display_kinds(probe.spec.args)


def _bad(word: str, event: str, why: str):
    raise UstackError(f"bad fetch-arg '{word}' in '{event}': {why}")


class NamedArgError(UstackError):
    """An argument by name this probe cannot fetch (a glob skips the
    function, one named function fails with this message)."""
