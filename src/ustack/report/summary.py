"""What a run says on stderr when it ends: refused debug files, losses
with the option that helps, and the traced command's exit status."""
from __future__ import annotations

from io import TextIOBase

from ..model import Losses

MAX_ADVISED_PAGES = 8192        # 32 MiB per CPU: more only delays a slow reader


def write_summary(err: TextIOBase, *, warnings=(), losses: Losses = Losses(),
                  backend: str = "", buffer_pages: int = 0, stack_storage: int = 0,
                  command: str = "", exit_status=None,
                  events: int | None = None, copied_stacks: bool = False,
                  notes=()) -> None:
    """`copied_stacks`: the run copied stacks out for ustack to unwind, whose
    losses a larger buffer only delays (decoding is what falls behind);
    `notes`: lines on how the run went (the capture's end_notes)."""
    for note in notes:
        print(note, file=err)
    if losses.uncounted:
        total = sum(n for _why, n in losses.uncounted)
        why = ", ".join(f"{n} {reason}" for reason, n in losses.uncounted)
        print(f"{total} events were not counted ({why}): try "
              f"--stack-storage-size {stack_storage * 4}", file=err)
    if losses.skipped:
        print(f"{losses.skipped} events were missed: the kernel ran no program of "
              f"ustack's for them, another BPF program (or a bpf() call) being "
              f"under way on that CPU", file=err)
    if losses.cut_short:
        total = sum(n for _why, n in losses.cut_short)
        why = ", ".join(f"{n}: {reason}" for reason, n in losses.cut_short)
        print(f"{total} events' stacks were cut short by the in-kernel unwinder "
              f"({why}); each such stack ends with a note", file=err)
    if losses.deferral_full:
        print(f"{losses.deferral_full} of them could have been finished by ustack but "
              f"its ring for them was full (stacks the kernel could not walk: "
              f"a program started before its unwind table was loaded, a memory "
              f"map locked, a table full, a stack deeper than the walk): try --buffer-pages "
              f"{max(4 * buffer_pages, 1024)}", file=err)
    for warning in dict.fromkeys(warnings):          # each once, in order
        print(f"ustack: {warning}", file=err)
    if losses.lost and copied_stacks:
        print(f"Lost {losses.lost} events: the {backend} buffer was full; copied "
              f"stacks are unwound at tens of thousands of events/s, and a "
              f"larger --buffer-pages only delays the losses: fewer events (a "
              f"narrower probe, a lower -F) or in-kernel unwinding (--backend "
              f"bpf) keep up", file=err)
    elif losses.lost and buffer_pages >= MAX_ADVISED_PAGES:
        print(f"Lost {losses.lost} events: the {backend} buffer was full even "
              f"at {buffer_pages} pages per CPU: the events come faster than "
              f"they are read; fewer events keep up", file=err)
    elif losses.lost:
        print(f"Lost {losses.lost} events: the {backend} buffer was full "
              f"(try --buffer-pages {buffer_pages * 4})", file=err)
    if losses.records_lost:
        print(f"Lost {losses.records_lost} records of process changes (fork, exec, "
              "mmap): frames in the processes they describe may be unnamed",
              file=err)
    if losses.dropped:
        print(f"{losses.dropped} events were dropped unread: the run was asked "
              "to end while they waited to be read", file=err)
    if losses.throttled:
        print(f"The kernel throttled sampling {losses.throttled} times: samples "
              "were dropped uncounted (see kernel.perf_event_max_sample_rate; "
              "lower -F)", file=err)
    if events == 0 and not losses.lost and not losses.skipped and not losses.dropped:
        print("ustack: no events were seen: the probes never fired in this run",
              file=err)
    if command and exit_status not in (None, 0):
        print(f"{command} {ended(exit_status)}", file=err)


def ended(exit_status: int) -> str:
    """How a command ended, from its exit code as os.waitstatus_to_exitcode
    gives it (a signal as its negative number)."""
    if exit_status >= 0:
        return f"exited with status {exit_status}"
    import signal
    try:
        name = signal.Signals(-exit_status).name
    except ValueError:
        name = f"signal {-exit_status}"
    return f"was killed by {name}"
