"""`count --weight EXPR`: each event adds the value of one of its
arguments to its stack's total instead of 1, as bpftrace's
`@[ustack] = sum(arg0)` does.

EXPR is one argument as trace spells it: a uprobe's parameter name, a
fetch-arg (`%di`, `+8(%si):u32`, `$arg2`, `$stack1`), bpftrace's `argN`
(the N+1-th integer argument register of a uprobe; a USDT probe's note
argument N), `retval` at a uretprobe, or a field of a syscall's or
tracepoint's record by name (`count` of syscall:write). The value is one
number: strings, arrays and $comm are refused before any probe is
placed. Values are summed as signed 64-bit integers, as bpftrace's sum():
an argument of a signed type adds its negative values as such, an
unsigned one never subtracts."""
from __future__ import annotations

import re

from ..model import TracepointProbe, UprobeProbe, UstackError
from ..values import replace, value
from .fetchargs import GO_ARGS, WEIGHT_ARG, parse_fetch_args, probe_kinds

# patterns compiled at first use (re's cache): --weight only
_ARGN = r"arg([0-9]+)"
_FETCH_STARTS = "%$@+-\\"               # how the kernel's fetch-args start
_ARGS_PREFIX = r"args(?:->|\.)"    # bpftrace's args->count
# a syscall's argument that counts bytes: the reports name the unit
_BYTE_FIELDS = frozenset(("count", "len"))


@value
class Weight:
    """What a weighted run sums per stack."""
    expr: str                          # as the user wrote it
    unit: str = ""                     # "bytes" where the argument is a size in bytes

    @property
    def label(self) -> str:
        """How the reports name the sums: `bytes (count)` or `sum of n`."""
        return f"{self.unit} ({self.expr})" if self.unit else f"sum of {self.expr}"


def weigh_specs(specs: list, expr: str | None) -> list:
    """The specs of a --weight EXPR run each weighed (weigh_spec); as they
    are without --weight."""
    return specs if expr is None else [weigh_spec(s, expr) for s in specs]


def weigh_spec(spec, expr: str):
    """The spec with EXPR as its only fetch-arg (count splits no stack by
    the others); syscalls and tracepoints unchanged, their field is
    checked once resolved (weigh_probes)."""
    word = expr.strip()
    if not word or len(word.split()) != 1:
        raise UstackError(f"--weight takes one argument, not '{expr}'")
    if spec.kind == "profile":
        raise UstackError(f"--weight {word}: {spec.text} has no arguments to weigh by "
                          "(a timed sample)")
    if spec.kind in ("syscall", "tracepoint"):
        return spec
    m = re.fullmatch(_ARGN, word)
    if m and spec.kind in ("uprobe", "uretprobe"):
        n = int(m.group(1))
        if n >= len(GO_ARGS):          # said as the user spelled it, from arg0
            raise UstackError(f"--weight {word}: a uprobe's arguments are arg0…"
                              f"arg{len(GO_ARGS) - 1} (a C function's arg0…arg5)")
        word = f"$arg{n + 1}"                      # bpftrace's arg0 is the first
    elif word == "retval":
        word = "$retval"
    ((_name, fetch, typ),) = parse_fetch_args([word], spec.kind, spec.text)
    from .named_args import is_name        # (DWARF's modules: weighted runs only)
    if not is_name(fetch) and fetch[:1] not in _FETCH_STARTS:
        raise UstackError(f"--weight {expr}: not an argument ustack reads (a parameter "
                          "name, argN, retval, or a fetch-arg such as '+8(%di):u32')")
    base = typ.partition("[")[0]
    if base in ("string", "ustring") or fetch == "$comm" or fetch.startswith('\\"'):
        raise UstackError(f"--weight {expr}: a string is not a number to sum")
    if "[" in typ:
        raise UstackError(f"--weight {expr}: an array is not one number to sum")
    return replace(spec, args=((WEIGHT_ARG, fetch, typ),))


def weigh_probes(probes: list, expr: str) -> tuple:
    """(the probes, the Weight): each resolved probe's weight checked,
    tracepoints given the field to read."""
    out, units = [], set()
    for probe in probes:
        if isinstance(probe, UprobeProbe):
            kind = probe_kinds(probe).get(WEIGHT_ARG)
            if kind == "str":
                raise UstackError(f"--weight {expr}: it is a string in {probe.label}, "
                                  "not a number to sum")
            units.add("")
        elif isinstance(probe, TracepointProbe):
            field = _field(probe, expr)
            out.append(replace(probe, fields=(field,)))
            units.add("bytes" if probe.spec.kind == "syscall" and field in _BYTE_FIELDS
                      else "")
            continue
        out.append(probe)
    unit = units.pop() if len(units) == 1 else ""
    return out, Weight(expr.strip(), unit)


def _field(probe: TracepointProbe, expr: str) -> str:
    """The record's field EXPR names, checked to be one number."""
    from ..kernel.trace_format import parse_format
    from ..kernel.tracefs import event_format
    name = re.sub(_ARGS_PREFIX, "", expr.strip(), count=1)
    fields = parse_format(event_format(probe.group, probe.name))
    own = [f for f in fields if not f.startswith("common_") and f != "__syscall_nr"]
    f = fields.get(name)
    if f is None or name not in own:
        have = ", ".join(own) or "none"
        raise UstackError(f"--weight {expr}: {probe.label} has no argument '{name}'; "
                          f"its arguments: {have}")
    if f.data_loc:
        raise UstackError(f"--weight {expr}: {name} of {probe.label} is a string, "
                          "not a number to sum")
    if f.count != 1 or f.size not in (1, 2, 4, 8):
        raise UstackError(f"--weight {expr}: {name} of {probe.label} is an array, "
                          "not one number to sum")
    return name


def as_s64(n: int) -> int:
    """A sum as the kernel's signed 64-bit counter holds it."""
    n &= (1 << 64) - 1
    return n - (1 << 64) if n >> 63 else n
