"""`ustack report`: a recording (commands/record.py), or with --from the
intervals of `--every` (commands/report_from.py, which loads no capture
machinery)."""
from __future__ import annotations


def main(args) -> int:
    if getattr(args, "source", None):
        from .report_from import report_from
        return report_from(args)
    from .record import main as record_main
    return record_main(args)
