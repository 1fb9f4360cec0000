"""Calls per function, bcc funccount's layout: least to most called, zeros
left out."""
from __future__ import annotations


def format_calls(calls) -> str:
    """`calls`: (function name, count) pairs."""
    rows = sorted(((n, c) for n, c in calls if c), key=lambda r: (r[1], r[0]))
    lines = [f"{'FUNC':<36s} {'COUNT':>8s}"]
    lines += [f"{name:<36s} {count:8d}" for name, count in rows]
    return "\n".join(lines) + "\n"
