"""`count --weight EXPR` in the kernel: per probe, a program generated
for its weight runs first on each event, reads the value (the uprobe's
fetch-arg as trace's BPF program fetches it, bpf_fetchargs.py, or a
field of the tracepoint's record), puts it in the per-CPU `weights` map
(bpf/ustack.h) and tail-calls the probe's counting program (counts.bpf.c
or unwind.bpf.c, given COUNT_WEIGHT / UW_WEIGHT), which adds it to the
stack's count in place of 1. The counting programs stay the C that ships;
the generated part is the fetch alone.

The value is the fetch's, cut to its type's size and sign-extended when
the type is signed (so an `int` of -5 adds -5), summed as a signed 64-bit
integer, as bpftrace's sum(). A read that faults adds 0 (BPF cannot fault
a page in, as the kernel's uprobe fetch of the perf backend does: a value
in a page the process never touched)."""
from __future__ import annotations

from ..kernel import bpf_syscall
from ..kernel.bpf_syscall import (ADD, AND, ARSH, JEQ, LSH, RSH, Asm, alu_imm, alu_reg,
                                  call, jmp_imm, ld_imm64, ld_map_fd, ldx, mov, mov_imm,
                                  st_imm, stx)
from ..model import TracepointProbe, UstackError
from .bpf_common import prog_type_of, program_result
from .bpf_fetchargs import CannotFetch, Emitter, compile_args

TAIL_CALL = 12                 # bpf_tail_call
_KEY = -8                      # r10 offsets: the map key
_SLOT = -16                    # a value read from user memory
VALUE = 7                      # the register holding the weight


class WeightPrograms:
    """The run's `weights` map, and the programs that fill it: wrap() puts
    one before each probe's counting program."""

    def __init__(self, owned, obj):
        self.owned = owned
        self.weights = owned.map(obj.make_map("weights"))

    def wrap(self, index: int, probe, counting: int) -> int:
        """The program to attach for `probe`: its weight, then `counting`."""
        following = self.owned.map(bpf_syscall.Map(bpf_syscall.MAP_PROG_ARRAY, 4, 4, 1,
                                                   "ustack_wnext"))
        following.update((0).to_bytes(4, "little"), counting.to_bytes(4, "little"))
        code = weight_code(probe, self.weights.fd, following.fd, program_result(probe))
        return self.owned.program(bpf_syscall.load_program(
            prog_type_of(probe), code, f"ustack_w{index}"))


def weight_code(probe, weights_fd: int, following_fd: int, result: int) -> bytes:
    a = Asm()
    a.emit(mov(6, 1))
    if isinstance(probe, TracepointProbe):
        _field(a, probe)
    else:
        _fetched(a, probe)
    a.emit(st_imm(10, _KEY, 0, size=4), ld_map_fd(1, weights_fd), mov(2, 10),
           alu_imm(ADD, 2, _KEY), call(bpf_syscall.FN_MAP_LOOKUP_ELEM))
    a.jump(jmp_imm, JEQ, 0, 0, to="out")
    a.emit(stx(0, 0, VALUE), mov(1, 6), ld_map_fd(2, following_fd), mov_imm(3, 0),
           call(TAIL_CALL))
    a.label("out")                      # (the tail call never fails: its slot is set)
    a.emit(mov_imm(0, result), bpf_syscall.exit_())
    return a.assemble()


def _field(a: Asm, probe: TracepointProbe) -> None:
    """VALUE = the record's field (ctx is the record; its first word, the
    common fields, holds the pt_regs pointer, the fields after it are intact)."""
    from ..kernel.trace_format import parse_format
    from ..kernel.tracefs import event_format
    f = parse_format(event_format(probe.group, probe.name))[probe.fields[0]]
    if f.offset % f.size:
        raise UstackError(f"--weight: {f.name} of {probe.label} is not aligned "
                          "for BPF to read; use --backend perf")
    a.emit(ldx(VALUE, 6, f.offset, size=f.size))
    _extend(a, f.size, f.signed)


def _fetched(a: Asm, probe) -> None:
    """VALUE = the uprobe's one fetch-arg, as bpf_fetchargs fetches it."""
    try:
        fetch = compile_args(probe)
    except CannotFetch as e:
        raise UstackError(f"--weight: BPF cannot fetch {e}; use --backend perf") from None
    arg = fetch.args[0]
    emitter = Emitter(a, 10, _SLOT, "w", fetch)
    if arg.node[0] == "deref":          # memory at inner + off, the type's size
        _op, off, inner = arg.node
        emitter.value(inner)
        emitter.add(1, off)
        a.emit(mov(3, 1), st_imm(10, _SLOT, 0), mov(1, 10), alu_imm(ADD, 1, _SLOT),
               mov_imm(2, arg.size), call(bpf_syscall.PROBE_READ_USER),
               ldx(VALUE, 10, _SLOT))
    else:
        emitter.value(arg.node)
        a.emit(mov(VALUE, 1))
    if emitter.faults:                  # a dereference on the way faulted: 0
        a.jump(bpf_syscall.ja, to="wvalue")
        a.label("wfault")
        a.emit(mov_imm(VALUE, 0))
        a.label("wvalue")
    if arg.bits:
        width, offset = arg.bits
        a.emit(alu_imm(RSH, VALUE, offset))
        if width < 32:
            a.emit(alu_imm(AND, VALUE, (1 << width) - 1))
        elif width < 64:
            a.emit(ld_imm64(2, (1 << width) - 1), alu_reg(AND, VALUE, 2))
        return
    _extend(a, arg.size, arg.signed and arg.kind != "hex")


def _extend(a: Asm, size: int, signed: bool) -> None:
    """VALUE cut to `size` bytes, sign-extended when signed."""
    if size < 8:
        shift = 64 - 8 * size
        a.emit(alu_imm(LSH, VALUE, shift), alu_imm(ARSH if signed else RSH, VALUE, shift))
