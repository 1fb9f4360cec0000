"""EVENT text -> ProbeSpec, in bpftrace's spellings. Nothing is resolved here."""
from __future__ import annotations

import re

from ustack.model import ProbeSpec, UstackError
from ustack.probes.fetchargs import parse_fetch_args
from ..values import replace

_EXAMPLES = "expected e.g. syscall:write, uprobe:/bin/ls:main, profile:hz:99"
_KINDS = {
    "syscall": "syscall",
    "tracepoint": "tracepoint", "t": "tracepoint",
    "uprobe": "uprobe", "u": "uprobe",
    "uretprobe": "uretprobe", "ur": "uretprobe",
    "usdt": "usdt", "U": "usdt",
    "profile": "profile", "p": "profile",
}
# Tracepoint and syscall names: identifiers, possibly with glob characters.
# (compiled at first use, by re's cache: not every run parses both)
_TP_NAME = r"[A-Za-z0-9_*?\[\]!-]+"
_NUMBER = r"0[xX][0-9a-fA-F]+|[0-9]+"


def parse_event(text: str) -> ProbeSpec:
    """One EVENT; a uprobe may be followed, in the same argument, by
    fetch-args: 'uprobe:/bin/x:f %di len=%si:u32'."""
    text = text.strip()
    head, *words = text.split() or [""]
    kind_word, sep, rest = head.partition(":")
    kind = _KINDS.get(kind_word)
    if kind is None:
        _fail(text, f"unknown probe type '{kind_word}'" if sep else "no probe type")
    spec = _PARSERS[kind](head, kind, rest)
    if not words:
        return spec
    if kind not in ("uprobe", "uretprobe", "usdt"):
        if not any(w[:1] in "%$+-@" or "=" in w for w in words):
            _PARSERS[kind](text, kind, text.partition(":")[2])  # a stray space
        _fail(text, "only uprobe, uretprobe and usdt take fetch-args")
    return replace(spec, text=text,
                               args=parse_fetch_args(words, kind, text))


def _fail(text: str, why: str):
    raise UstackError(f"malformed event '{text}': {why}; {_EXAMPLES}")


def _number(s: str):
    if not re.fullmatch(_NUMBER, s):
        return None
    if len(s) > 1 and s[0] == "0" and s[1] not in "xX":
        raise UstackError(f"ambiguous number {s!r}: write 0x{s.lstrip('0') or '0'} "
                          f"for hex or {int(s, 10)} for decimal")
    return int(s, 0)


def _syscall(text, kind, rest):
    if not re.fullmatch(_TP_NAME, rest):
        _fail(text, "missing or invalid syscall name")
    return ProbeSpec(kind="syscall", text=text, group="syscalls", name=rest)


def _tracepoint(text, kind, rest):
    parts = rest.split(":")
    if len(parts) != 2 or not all(re.fullmatch(_TP_NAME, p) for p in parts):
        _fail(text, "need GROUP:NAME after the probe type")
    return ProbeSpec(kind="tracepoint", text=text, group=parts[0], name=parts[1])


def _uprobe(text, kind, rest):
    # PATH ends at the first ':'; the rest is FUNC (C++ names contain '::').
    path, sep, func = rest.partition(":")
    if not sep or not path or not func:
        _fail(text, f"need {kind}:PATH:FUNCTION")
    offset = 0
    base, plus, tail = func.rpartition("+")
    if plus and _number(tail) is not None:  # 'operator+' keeps its '+'
        if not base:
            _fail(text, "missing function name before '+'")
        func, offset = base, _number(tail)
        if kind == "uretprobe" and offset:
            _fail(text, "a uretprobe takes no +OFFSET")
    address = _number(func)
    if address is not None:
        return ProbeSpec(kind=kind, text=text, path=path, address=address + offset)
    return ProbeSpec(kind=kind, text=text, path=path, function=func, offset=offset)


def _usdt(text, kind, rest):
    # PATH ends at the first ':'; then NAME or PROVIDER:NAME (bpftrace's)
    path, sep, probe = rest.partition(":")
    provider, _, name = probe.rpartition(":")
    if not sep or not path or not name or not re.fullmatch(_TP_NAME, name) \
            or (provider and not re.fullmatch(_TP_NAME, provider)):
        _fail(text, "need usdt:PATH:PROVIDER:NAME or usdt:PATH:NAME")
    return ProbeSpec(kind="usdt", text=text, path=path, name=name,
                     provider=provider or None)


def _profile(text, kind, rest):
    unit, sep, value = rest.rpartition(":")
    if sep and unit != "hz":
        _fail(text, f"unknown profile unit '{unit}' (only hz)")
    hz = int(value) if re.fullmatch(r"[0-9]+", value) else 0
    if hz <= 0:
        _fail(text, "the frequency must be a positive number of Hz")
    return ProbeSpec(kind="profile", text=text, hz=hz)


_PARSERS = {"syscall": _syscall, "tracepoint": _tracepoint, "uprobe": _uprobe,
            "uretprobe": _uprobe, "usdt": _usdt, "profile": _profile}
