"""What the BPF capture modules share and must not import from one another:
the built objects they load, what a program returns, the program type a
probe needs, and the fetch-args area of a trace record. bpf_counter,
bpf_unwind, bpf_python, bpf_fetchargs and bpf_weight import this module;
it imports none of them, so their imports run one way."""
from __future__ import annotations

from ..bpf import object_path
from ..kernel import bpf_syscall
from ..kernel.bpf_object import bpf_object
from ..model import ProfileProbe, TracepointProbe, UprobeProbe

# what a program returns: 0 drops the perf sample, 1 lets perf go on with it
DROP_SAMPLE, PASS_ON = 0, 1

# a trace record's fetch-args (capture/bpf_fetchargs.py) are written after
# its frames, over the walk's window (struct walk's window[ARGS_AREA]):
# ARGS_AREA bytes fit after the longest stack
ARGS_AREA = 12 << 10


def bpf_program_object(name: str):
    """The built object of src/ustack/bpf/NAME.bpf.c, parsed once."""
    return bpf_object(object_path(name))


def unwind_object():
    """src/ustack/bpf/unwind.bpf.c's object: its programs, and the layouts
    and values (ustack.h, python.h) the unwinder modules share with them."""
    return bpf_program_object("unwind")


def prog_type_of(probe) -> int:
    if isinstance(probe, UprobeProbe):
        return bpf_syscall.PROG_KPROBE
    if isinstance(probe, TracepointProbe):
        return bpf_syscall.PROG_TRACEPOINT
    if isinstance(probe, ProfileProbe):
        return bpf_syscall.PROG_PERF_EVENT
    raise TypeError(probe)


def program_result(probe) -> int:
    """What a counting program returns for `probe` (see bpf_capture.py's
    doc): PASS_ON only on a tracepoint, which other tools may share."""
    return PASS_ON if isinstance(probe, TracepointProbe) else DROP_SAMPLE
