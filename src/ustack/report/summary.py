"""What a run says on stderr when it ends: refused debug files, losses
with the option that helps, and the traced command's exit status."""
from __future__ import annotations

from typing import Optional, TextIO

from ..model import Losses


def write_summary(err: TextIO, *, warnings=(), losses: Losses = Losses(),
                  backend: str = "", buffer_pages: int = 0, stack_storage: int = 0,
                  command: str = "", exit_status=None,
                  events: Optional[int] = None) -> None:
    if losses.uncounted:
        total = sum(n for _why, n in losses.uncounted)
        why = ", ".join(f"{n} {reason}" for reason, n in losses.uncounted)
        print(f"{total} events were not counted ({why}): try "
              f"--stack-storage-size {stack_storage * 4}", file=err)
    if losses.cut_short:
        total = sum(n for _why, n in losses.cut_short)
        why = ", ".join(f"{n}: {reason}" for reason, n in losses.cut_short)
        print(f"{total} events' stacks were cut short by the in-kernel unwinder "
              f"({why}); each such stack ends with a note", file=err)
    for warning in dict.fromkeys(warnings):          # each once, in order
        print(f"ustack: {warning}", file=err)
    if losses.lost:
        print(f"Lost {losses.lost} events: the {backend} buffer was full "
              f"(try --buffer-pages {buffer_pages * 4})", file=err)
    if losses.throttled:
        print(f"The kernel throttled sampling {losses.throttled} times: samples "
              "were dropped uncounted (see kernel.perf_event_max_sample_rate; "
              "lower -F)", file=err)
    if events == 0 and not losses.lost:
        print("ustack: no events were seen: the probes never fired in this run",
              file=err)
    if command and exit_status not in (None, 0):
        print(f"{command} exited with status {exit_status}", file=err)
