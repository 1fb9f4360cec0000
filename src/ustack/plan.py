"""How a run captures and unwinds (`plan`): the backend, and the unwinder
each probe's samples need, which `--unwind auto` decides per probe.

Frame pointers are cheap (the kernel walks them, nothing is copied) but only
right when every frame keeps rbp. DWARF is right everywhere, and auto takes
it everywhere; counted runs (count, profile) walk it in the kernel
(capture/bpf_unwind.py) wherever the kernel loads that program, else the capture copies registers plus stack per
sample for ustack to unwind; so does trace, whose events' frames come
through a ring buffer, with the values of their fetch-args where the BPF
program can fetch them all (capture/bpf_fetchargs.py; else the copy path,
whose uprobes fetch them in the kernel's own way). Frame pointers are
walked only when asked (--unwind fp): they lose a frameless leaf's caller
(Go, -O2 C) and stop in libc, which keeps none on Debian."""
from __future__ import annotations

from collections.abc import Callable

from .capture import bpf_unwind
from .kernel import bpf_syscall, credentials
from .model import ProfileProbe, UprobeProbe, UstackError
from .objfile.elf import ElfImage
from .unwind import tables
from .values import value


def choose(probe, requested: str, main_binary: str | None = None) -> str:
    """'fp' or 'dwarf' for one resolved probe. auto is DWARF (Go's pclntab
    for Go code) everywhere: frame pointers lose a frameless leaf's caller
    (Go's, -O2 C's) and stop at libc's frames, and one program's stacks
    must share one root whatever the event; frame pointers only when asked."""
    return requested if requested in ("fp", "dwarf") else "dwarf"


@value
class Plan:
    """How a run captures and unwinds, decided once (by `plan`)."""
    backend: str                   # perf | bpf | tracefs
    modes: tuple                   # per probe: fp | dwarf | none
    note: str = ""                 # why another backend than asked, for the user
    # DWARF unwinding in the kernel (bpf backend): an object's unwind rows
    kernel_tables: Callable | None = None
    # a run without root: perf events that sample user space only
    user_only: bool = False

    @property
    def unwind(self) -> str:
        """What the header says: the modes in use."""
        return "/".join(sorted(set(self.modes)))

    def fp_advice(self) -> str | None:
        """What a frame-pointer stack cut short advises; None when no
        probe of the run walks frame pointers."""
        if "fp" not in self.modes:
            return None
        if self.backend == "tracefs":
            return "--backend bpf or perf unwind with CFI"
        return "--unwind dwarf unwinds with CFI"


# why auto copies stacks although the kernel could unwind them
KEEPS_COPIES = "the recording keeps the stacks as copied (--raw-stacks)"


def plan(command: str, backend: str, unwind: str, probes: list,
         main_binary: str | None = None, kernel_stacks: bool = False,
         copy_reason: str | None = None) -> Plan:
    """The backend and per-probe unwind mode of a run of `command` (trace,
    count, profile, funccount) as the user asked (`backend`: auto | perf |
    bpf | tracefs; `unwind`: auto | fp | dwarf), or a UstackError saying why
    it cannot be done. The one place these choices are made. Without root
    (see unprivileged.py) only the perf backend can sample, user space only.
    `copy_reason`: why auto must copy stacks rather than unwind them in the
    kernel (KEEPS_COPIES), or None."""
    if backend == "tracefs":
        return Plan("tracefs", tuple(_tracefs_mode(p, unwind) for p in probes))
    if not credentials.privileged():    # what unprivileged.check let through
        return Plan("perf", tuple(choose(p, unwind) for p in probes), user_only=True)
    if command == "offcpu":          # sched tracepoints, DWARF in the kernel only
        why = _why_no_kernel_dwarf(probes)
        if why is not None:
            raise UstackError(f"offcpu cannot run: {why}")
        return Plan("bpf", ("dwarf",) * len(probes), kernel_tables=tables.for_image)
    if command == "funccount":      # calls counted, no stacks: nothing to unwind
        _why_not_bpf(command, backend, unwind, (), kernel_stacks)
        return Plan("bpf", ("none",) * len(probes))
    modes = tuple(choose(p, unwind, main_binary) for p in probes)
    counting = command in ("count", "profile") and backend in ("auto", "bpf")
    if command == "trace" and backend == "bpf":
        return _bpf_trace(probes, unwind)
    if (command == "trace" and backend == "auto" and unwind != "fp"
            and "dwarf" in modes and not kernel_stacks):
        why = copy_reason or _why_no_kernel_dwarf(probes)
        if why is None:
            args = _why_args_need_perf(probes)
            why = None if args is None else f"BPF does not fetch {args}"
        if why is None:           # each event's frames through a ring buffer
            return Plan("bpf", ("dwarf",) * len(probes), kernel_tables=tables.for_image)
        return Plan("perf", modes, _copied(why))
    if not counting:
        return Plan("perf", modes)
    if unwind != "fp" and _wants_dwarf(probes, modes, main_binary):
        why = (copy_reason if copy_reason and backend == "auto" and not kernel_stacks
               else _why_no_kernel_dwarf(probes))
        if why is None:
            return Plan("bpf", ("dwarf",) * len(probes), kernel_tables=tables.for_image)
        if not kernel_stacks:       # --kernel: frame pointers in the kernel, below
            # the copy path: complete stacks at a higher cost, and the user is told why
            return Plan("perf", modes, _copied(why))
    why_not = _why_not_bpf(command, backend, unwind, modes, kernel_stacks)
    if why_not is None:
        return Plan("bpf", ("fp",) * len(probes))
    if kernel_stacks:
        raise UstackError("--kernel needs in-kernel counting (the bpf backend), "
                          "which walks frame pointers only")
    return Plan("perf", modes, why_not)


def plan_latency(entries: list, unwind: str, wants_stacks: bool) -> tuple:
    """(Plan, why not DWARF or "") of `ustack latency` on the resolved
    `entries`: timed in the kernel (BPF); the entries' stacks, when wanted
    (--by-stack, --slower), unwound there with DWARF, else (--unwind fp,
    or the unwinder refused: `why`, for the user) by frame pointers."""
    if not bpf_syscall.available():
        raise UstackError("latency counts in the kernel and BPF is not available "
                          "here (bpf(2) failed)")
    n = len(entries)
    if not wants_stacks:
        return Plan("bpf", ("none",) * n), ""
    why = None if unwind == "fp" else _why_no_kernel_dwarf(entries)
    if unwind != "fp" and why is None:
        return Plan("bpf", ("dwarf",) * n, kernel_tables=tables.for_image), ""
    return Plan("bpf", ("fp",) * n), why or ""


def _copied(why: str) -> str | None:
    """The note of a run that copies stacks because of `why` (none when
    the user asked for the copies)."""
    return None if why == KEEPS_COPIES else f"{why}; stacks are copied and unwound by ustack"


def _bpf_trace(probes: list, unwind: str) -> Plan:
    """trace --backend bpf: stacks unwound in the kernel, a record per event
    through a BPF ring buffer; what it cannot do is refused, not changed."""
    if unwind == "fp":
        raise UstackError("trace --backend bpf unwinds with DWARF in the kernel; "
                          "for frame pointers use --backend perf")
    why = _why_args_need_perf(probes)
    if why is not None:
        raise UstackError(f"trace --backend bpf cannot fetch {why}; use --backend perf")
    why = _why_no_kernel_dwarf(probes)
    if why is not None:
        raise UstackError(f"trace --backend bpf: {why}")
    return Plan("bpf", ("dwarf",) * len(probes), kernel_tables=tables.for_image)


def _why_args_need_perf(probes: list) -> str | None:
    """None where the trace program fetches every fetch-arg of `probes`
    (capture/bpf_fetchargs.py, imported only then), else which one it
    cannot and why."""
    if not any(getattr(p, "fetch_args", ()) for p in probes):
        return None
    from .capture.bpf_fetchargs import why_not
    return why_not(probes)


def _wants_dwarf(probes: list, modes: tuple, main_binary: str | None) -> bool:
    """Whether frame pointers are not enough for a counting run: a probe
    needs DWARF, or Go is on the stack (frameless leaves and assembly)."""
    if "dwarf" in modes:
        return True
    paths = [p.path for p in probes if isinstance(p, UprobeProbe)]
    if main_binary is not None and len(paths) < len(probes):
        paths.append(main_binary)
    for path in paths:
        try:
            if ElfImage.open(path).is_go:
                return True
        except UstackError:
            pass
    return False


def _why_no_kernel_dwarf(probes: list) -> str | None:
    """None where the kernel runs ustack's DWARF unwinder (capture/
    bpf_unwind.py) for these probes, else why not, in the kernel's words."""
    if not bpf_syscall.available():
        return "BPF is not available here (bpf(2) failed)"
    why = bpf_unwind.why_unavailable(probes)
    return None if why is None else f"in-kernel DWARF unwinding failed to load: {why}"


def _why_not_bpf(command: str, backend: str, unwind: str, modes: tuple,
                 kernel_stacks: bool) -> str | None:
    """Why a counting run must use the perf backend ('' to say nothing),
    or None for BPF."""
    if command == "funccount":
        if not bpf_syscall.available():
            raise UstackError("funccount counts in the kernel and BPF is not "
                              "available here (bpf(2) failed)")
        from .capture.bpf_funccount import uprobe_multi_supported
        if not uprobe_multi_supported():
            raise UstackError("funccount attaches uprobe_multi links, which this "
                              "kernel lacks (Linux 6.6 or later)")
        return None
    if not bpf_syscall.available():
        if backend == "bpf" or kernel_stacks:
            raise UstackError("BPF is not available here (bpf(2) failed); "
                              "use --backend perf")
        return ""
    return None


def _tracefs_mode(probe, requested: str) -> str:
    """What ftrace alone can do: DWARF only where a uprobe fetches the stack."""
    if isinstance(probe, ProfileProbe):
        raise UstackError("profile events need perf events; the tracefs "
                          "backend has no timed samples")
    if isinstance(probe, UprobeProbe):
        return "fp" if requested == "fp" else "dwarf"
    if requested == "dwarf":
        raise UstackError(
            f"--backend tracefs cannot copy the stack at {probe.label} (only "
            "uprobes can, through fetch-args); use --unwind fp or auto")
    return "fp"


def launch_target(opts):
    """The Target of a run without -p: its -c command, started held
    (under ptrace when held_at_exit), or the whole machine."""
    from .target import process
    if opts.cmdline is None:
        return process.everything(opts.pids)
    if opts.backend == "tracefs" or held_at_exit(opts.command, opts.backend,
                                                 opts.python, opts.cmdline):
        from .target.traced_command import launch_traced    # (ptrace: not echo's)
        return launch_traced(opts.cmdline)
    return process.launch(opts.cmdline)


def held_at_exit(command: str, backend: str, python: bool, cmdline: str | None) -> bool:
    """Whether a -c command runs under ptrace (target/traced_command.py),
    held at its exit until the code objects of its Python frames are read
    (capture/bpf_python.PythonProcs.at_exit): a short Python command would
    otherwise be gone before the ring's records of them are read, its
    frames unnamed. Only a Python interpreter (its load closure maps one),
    with Python frames on, where the kernel merges them."""
    if cmdline is None or not python or command == "funccount" \
            or backend in ("perf", "tracefs"):
        return False
    from .objfile.needed import load_closure
    from .target import process
    from .unwind.runtime_files import may_be
    exe = process.command_executable(cmdline)
    try:
        closure = load_closure(exe) if exe is not None else []
    except OSError:
        return False
    if not any(may_be("python", path) for path in closure):
        return False            # (by the names alone: echo imports nothing of Python)
    from .unwind.python_runtime import runs_python
    return runs_python(closure)
