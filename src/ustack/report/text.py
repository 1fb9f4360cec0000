"""Per-event text: a perf-script-like header, then one frame a line in the
SystemTap's style: ` 0x00007f…2f65 : func+0x15/0x90 [libc.so.6]`."""
from __future__ import annotations

from ..model import SCRIPT_KINDS, Frame, Stack, unnamed_function


def frame_label(f: Frame) -> str:
    """`func+0x15/0x90 [module]` — the part of a frame line after the
    address; `func (inlined) [module]` for an inlined call; then ` file:line`
    when the frame has one. A Python frame: `func [python] file:line`. A
    frame no symbol names: `fn@0x11e0+0x16 [module]` from the start its
    object's CFI gives, else its address in the object `0x11f6 [module]`."""
    if f.kind in SCRIPT_KINDS:
        return python_label(f)
    module = f" [{f.module}]" if f.module else ""
    where = f" {f.file}:{f.line}" if f.line else ""
    if f.function is None:
        unnamed = unnamed_function(f)
        if unnamed is None:
            return f"[unknown]{module}{where}"
        offset = f"+0x{f.offset:x}" if f.objstart else ""
        return f"{unnamed}{offset}{module}{where}"
    if f.inlined:
        return f"{f.function} (inlined){module}{where}"
    size = f"/0x{f.size:x}" if f.size else ""
    return f"{f.function}+0x{f.offset:x}{size}{module}{where}"


def python_label(f: Frame) -> str:
    """A Python, PHP, Perl or Ruby frame has no object: the kind stands where
    the module would."""
    return f"{f.function} [{f.kind}] {f.file}:{f.line}" if f.line else f"{f.function} [{f.kind}]"


def frame_line(f: Frame) -> str:
    if f.kind in SCRIPT_KINDS or (f.kind in ("js", "java") and not f.addr):
        # no address of its own (a JS or Java frame named by its runtime's
        # own structures, not by a perf map): `name [java] File.java:12`
        return f" {'':18} : {python_label(f)}"
    return f" 0x{f.addr:016x} : {frame_label(f)}"


def header_parts(comm: str, pid: int, tid: int, cpu: int, event: str,
                 ns: tuple = ()) -> tuple:
    """The text before and after the timestamp of an event header
    `comm pid/tid [cpu] seconds: event` (how `perf script` starts a sample);
    split so a fast loop can reuse it for every event of a thread. `ns`:
    (pid, tid) in the process's own pid namespace, shown as `[ns 7/7]`
    after ours when they differ (a container's process)."""
    inner = f" [ns {ns[0]}/{ns[1]}]" if ns and tuple(ns) != (pid, tid) else ""
    return f"{comm} {pid}/{tid}{inner} [{cpu:03d}] ", f": {event}\n"


def format_duration(ns: int) -> str:
    """A time as people read it: `12.345 ms` (`1.234567 s` from a second)."""
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.6f} s"
    return f"{ns / 1e6:.3f} ms"


def is_timed(context) -> bool:
    """Whether a report's counts are nanoseconds (ReportContext.timed)."""
    return getattr(context, "value_unit", None) == "nanoseconds"


def format_time(time_ns: int) -> str:
    secs, ns = divmod(time_ns, 1_000_000_000)
    return f"{secs}.{ns // 1000:06d}"


def format_stack(stack: Stack) -> str:
    """The frame lines of one event, ending with the blank separator line."""
    lines = [frame_line(f) for f in stack.frames]
    lines.extend(f" ({note})" for note in stack.notes)
    return "\n".join(lines) + "\n\n"
