"""A uprobe's fetch-arg values as text, after the event name:
` name=0x2a n=42 c='A' s="text" arr={0x1,0x2} bad=?`, as the kernel's
print fmt shows them (hex by default, decimal for u/s types, quoted
strings), so the output reads like the kernel's own trace."""
from __future__ import annotations


def format_args(values) -> str:
    """' name=value …' of ArgsDecoder.decode()'s (name, kind, value)
    triples; '' for none (the text follows the event without a gap)."""
    out = [f"{name}={_shown(value, kind)}" for name, kind, value in values]
    return (" " + " ".join(out)) if out else ""


def _shown(value, kind: str) -> str:
    if value is None:                   # the record was too short to hold it
        return "?"
    if isinstance(value, bytes):
        return f'"{_escape(value)}"'
    if isinstance(value, tuple):
        return "{" + ",".join(_number(v, kind) for v in value) + "}"
    return _number(value, kind)


def _number(v: int, kind: str) -> str:
    if kind == "hex":
        return f"0x{v:x}"
    if kind == "char":
        return repr(chr(v & 0xFF))
    if kind == "bool":
        return "true" if v else "false"
    return str(v)


# what a string's text becomes inside double quotes: control characters and
# whatever Python's str.splitlines() takes for a line break escaped (so an
# event stays one line), a byte that is not UTF-8 as \xNN
_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, 0x85)}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t",
                 ord("\\"): "\\\\", ord('"'): '\\"',
                 0x2028: "\\u2028", 0x2029: "\\u2029"})
_ESCAPES.update({0xDC00 + b: f"\\x{b:02x}" for b in range(0x80, 0x100)})  # surrogateescape


def _escape(raw: bytes) -> str:
    """A string's bytes inside double quotes, on one line."""
    return raw.decode("utf-8", "surrogateescape").translate(_ESCAPES)
