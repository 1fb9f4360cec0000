"""The in-kernel DWARF unwinder: a BPF program that walks a user stack with
per-object unwind rows (unwind/tables.py) and counts each distinct stack
(count, profile) or writes it to a ring buffer (trace), so nothing but
frame addresses leaves the kernel.

How the program finds its way, per frame (one bpf_loop step each: the
verifier checks the body once, not once per frame):
- the mapping of the pc: bpf_find_vma (the task's own VMA tree, so no
  per-process list has to be kept in step with mmap), which gives the
  file's (dev, inode), the mapping's start and page offset. Its answers are
  kept in VMAS, keyed by (mm ctx_id, 2 MiB region): in a sample's interrupt
  find_vma answers once, then says the mm is busy until the interrupt
  ends. Consecutive frames in one mapping skip both;
- the object's rows: OBJECTS[(dev, inode)] = (first row, rows, vaddr -
  file offset of its code, its page index), loaded by UnwindObjects from
  user space, once per object whichever processes map it; a binary search
  over the rows of the pc's 4 KiB page (PAGES) finds the row;
- the rule: CFA = rsp|rbp + N (or the PLT's), return address at CFA - 8,
  rbp restored per the row; a sigreturn trampoline continues from the
  ucontext the kernel saved on the stack. Stack words come from a 512-byte
  window copied at once (a user copy's checks cost as much as its bytes).
Where the walk cannot go on (no rows for an object yet, code without a
file, a rule the rows do not encode, an unreadable stack) it stops and
says why in the stack's status: the capture turns that into a marker word
at the end of the callchain (model.KERNEL_UNWIND_STOP), the unwind stage
into a note on the stack. Never a guessed frame. A kernel thread (no mm)
has an empty user stack.

Deferred stacks: an object mapped during the run has no rows until user
space reads its MMAP2 record (5-20 ms later; a short program's every
event), and a sample's interrupt may find the memory map locked. Such a
walk (DEFERRABLE) is not counted cut: given a ring, the program writes the
event's registers and stack there (_defer, a DEFERRED record) and ustack
unwinds it as the copy path's samples (ring_samples makes it a DWARF
RawSample), once the MMAP2 records told it the mappings. Only where the
ring is full does the stack end cut, as walked.

Registers: a uprobe's context is the user pt_regs; a sample's context holds
them when it interrupted user mode; otherwise (syscalls, tracepoints, a
sample in the kernel) bpf_task_pt_regs(current) gives them.

Output: STACKS[hash] = (frame count, status, frames) and COUNTS[(pid_tgid,
probe, kernel stack id, hash)] += 1; the hash is a 64-bit FNV-style mix of
the frames and status, so the count key stays 24 bytes however deep the
stack. For trace, RECORD + frames per event into a BPF ring buffer; a
deferred record is RECORD (no frames, status DEFERRED) + DEFER + the
stack, in trace's ring or count/profile's own."""
from __future__ import annotations

import errno
import os
import re
import shlex
import struct
import threading
from array import array
from collections.abc import Callable

from ..kernel import bpf, btf
from ..kernel import perf_event as pe
from ..kernel.bpf import (ADD, AND, JEQ, JGE, JGT, JLT, JNE, JSGE, LSH,
                          MUL, RSH, SUB, XOR, Asm, alu_imm, alu_reg, atomic_add,
                          call, exit_, jmp_imm, jmp_reg, ld_func, ld_imm64,
                          ld_map_fd, ldx, mov, mov_imm, st_imm, stx)
from ..kernel import procfs
from ..kernel.bpf_object import bpf_object
from ..kernel.proc_root import backing_devices
from ..model import (KERNEL_UNWIND_STOP, Mapping, ProfileProbe, RawSample, TracepointProbe,
                     UprobeProbe, UstackError)
from ..objfile import cache as objcache
from ..objfile import needed
from ..objfile.elf import ElfImage
from ..objfile.mapped import object_path
from ..objfile.vdso import vdso_file
from .. import bpf as bpf_programs
from ..unwind import tables
from ..target import process
from .bpf import (MIN_COUNT_ENTRIES, PASS_ON, BpfCounter, InBackground, program_result,
                  prog_type_of, unless_traced)
from .kernel_offsets import Offsets

BPF_LOOP = 181
ARSH = 0xC0


def unwind_object():
    """src/ustack/bpf/unwind.bpf.c's object: its programs, and the layouts
    and values (ustack.h) this module shares with them."""
    return bpf_object(bpf_programs.object_path("unwind"))


_OBJ = unwind_object()
MAX_FRAMES = 128                 # ustack.h: a power of two, the frame index is masked
ROW = tables.ROW                 # struct unwind_row
ROW_SIZE = ROW.size
OBJ_KEY = _OBJ.layout("object_key").struct
# first row, rows, vaddr - file offset; page index: first slot, first page, pages
OBJ_VALUE = _OBJ.layout("object_rows").struct
STACK_HEAD = _OBJ.layout("stack_head").struct     # frames, status
# a trace record: time (CLOCK_MONOTONIC ns), pid_tgid, probe, cpu, then STACK_HEAD
RECORD = _OBJ.layout("trace_record").struct
# a deferred record (RECORD with no frames, status DEFERRED), then the
# event's ip, sp, bp, kernel stack id, bytes of stack copied, then
# DEFER_STACK bytes from sp (the copied ones first)
_DEFERRED = _OBJ.layout("deferred_record")
_TOKENS = dict(zip(_DEFERRED.fields, re.findall(r"\d*[a-zA-Z?]", _DEFERRED.struct.format[1:])))
DEFER = struct.Struct("<" + "".join(_TOKENS[f] for f in ("ip", "sp", "bp", "kernel_stack",
                                                          "copied")))
DEFER_STACK = _DEFERRED.size - _DEFERRED.offsets["stack"]
DEFER_RECORD = _DEFERRED.size
DEFER_RING_BYTES = 4 << 20       # count/profile's ring of deferred records (~500)
COUNT_KEY = _OBJ.layout("unwind_count_key").struct  # pid_tgid, probe, kernel stack id, hash
_U64 = struct.Struct("<Q")
VDSO_KEY = (0, 1)                # OBJECTS' key of the vDSO (it has no file)
VMA_REGION_SHIFT = 21           # the VMA cache's key: (mm ctx_id, address >> 21)
VMA_VALUE = 40                   # vm_start, vm_end, vm_pgoff, dev, inode
PAGE_SHIFT = 12                  # unwind/tables.py's page index granule
SEARCH_STEPS = 22                # binary search steps: 4 M rows

# row kinds (unwind/tables.py)
K_GAP, K_SP, K_BP, K_PLT, K_END, K_SIGNAL, K_UNSUPPORTED = range(7)
BP_SAME, BP_AT, BP_LOST, BP_AT_BP = range(4)

# why a walk stopped (enum unwind_status); COMPLETE is a whole stack
_STATUS = _OBJ.enum("unwind_status")
(COMPLETE, NO_MAPPING, NO_FILE, NO_TABLE, NO_CFI, GAP, UNSUPPORTED, NO_BP,
 READ_FAILED, NO_PROGRESS, TRUNCATED, VMA_BUSY, TABLE_FULL) = (_STATUS[name] for name in (
     "COMPLETE", "NO_MAPPING", "NO_FILE", "NO_TABLE", "NO_CFI", "GAP", "UNSUPPORTED",
     "NO_BP", "READ_FAILED", "NO_PROGRESS", "TRUNCATED", "VMA_BUSY", "TABLE_FULL"))
THROUGH_JIT = _STATUS["THROUGH_JIT"]   # complete, a JIT frame on its frame pointer
# a deferred record's status: the stack goes to user space to be unwound
DEFERRED = _STATUS["DEFERRED"]
# walks that end so are deferred (where the program has a ring for it): an
# object mapped before its rows could be loaded (a program exec'd during
# the run), a memory map locked while a sample's interrupt asked for a VMA
DEFERRABLE = (NO_TABLE, VMA_BUSY)
TABLE_FULL_MARK = 0x7FFFFFFF     # an object's first row when its rows did not fit
_RUNNING = _STATUS["RUNNING"]

# ucontext of a signal frame, at sp when the handler returned into __restore_rt
_GREGS = 40
_UC_RBP, _UC_RSP, _UC_RIP = _GREGS + 8 * 10, _GREGS + 8 * 15, _GREGS + 8 * 16

# the per-CPU scratch value
S_PC, S_SP, S_BP, S_EXACT, S_BPOK, S_HASH, S_CFA, S_Q = range(0, 64, 8)
S_MSTART, S_MEND, S_FIRST, S_NROWS, S_ADJ, S_LO, S_HI, S_VADDR = range(64, 128, 8)
S_TMP, S_ROW, S_PSLOT, S_PBASE, S_NPAGES, S_WIN = range(128, 176, 8)
S_REC = 176                      # a trace record: RECORD, then the frames
S_STACK = 200                    # STACK_HEAD, then the frames
S_FRAMES = S_STACK + STACK_HEAD.size
WINDOW = 512                     # bytes of stack copied at a time (_read_user)
S_WINBUF = S_FRAMES + 8 * MAX_FRAMES
S_FP_USED = S_WINBUF + WINDOW    # 1 once a frame without a file was walked on rbp
# a trace record's fetch-args (capture/bpf_fetchargs.py) are written after
# its frames, over the window (the walk is done by then): ARGS_AREA bytes
# fit after the longest stack
ARGS_AREA = 12 << 10
SCRATCH_SIZE = max(S_FP_USED + 8, S_FRAMES + 8 * MAX_FRAMES + ARGS_AREA,
                   _OBJ.layout("walk").size)
STACK_VALUE = STACK_HEAD.size + 8 * MAX_FRAMES

_FNV_PRIME = 0x100000001B3
_FNV_BASIS = 0xCBF29CE484222325
# slots of the errors map (enum unwind_error)
_ERRORS = _OBJ.enum("unwind_error")
ERR_STACKS_FULL, ERR_COUNTS_FULL, ERR_RING_FULL, ERR_UNDEFERRED = (_ERRORS[name] for name in (
    "UW_STACKS_FULL", "UW_COUNTS_FULL", "UW_RING_FULL", "UW_UNDEFERRED"))
ERR_SLOTS = _ERRORS["UNWIND_ERROR_SLOTS"]


def kernel_dev(st_dev: int) -> int:
    """A stat() st_dev in the kernel's own encoding (MAJOR << 20 | MINOR),
    as inode->i_sb->s_dev holds it."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def deferral_ring_bytes(buffer_pages: int) -> int:
    """count/profile's ring of deferred stacks: DEFER_RING_BYTES, more as
    --buffer-pages grows, a power of two."""
    want = max(DEFER_RING_BYTES, buffer_pages * 4096 * 4)
    return 1 << (want - 1).bit_length()


# --- the program ---------------------------------------------------------------

def _lookup0(a: Asm, m: bpf.Map, dst: int, key_at: int = -4) -> None:
    """dst = m[0] (an ARRAY map's first value), the key kept at r10+key_at."""
    a.emit(st_imm(10, key_at, 0, size=4), ld_map_fd(1, m.fd), mov(2, 10),
           alu_imm(ADD, 2, key_at), call(bpf.MAP_LOOKUP), mov(dst, 0))


def _sext32(a: Asm, reg: int) -> None:
    a.emit(alu_imm(LSH, reg, 32), alu_imm(ARSH, reg, 32))


class UnwindProgram:
    """The maps the program reads and writes, and its code per probe."""

    def __init__(self, maps: "UnwindMaps", offsets: Offsets):
        self.maps = maps
        self.off = offsets
        self._reads = 0                  # labels of _read_user's call sites

    def code(self, probe_index: int, probe, *, tgids=None, armed=None,
             result: int = PASS_ON, prelude=None, then=None) -> tuple:
        """(bytes, function offsets) of a program for one probe that walks
        the stack and stores it in STACKS (the C programs are
        src/ustack/bpf/unwind.bpf.c's; this assembled walk remains for
        latency's DWARF entry and off-CPU until they are C too).
        `then(asm)`: what to do with the stack once it is stored, its hash
        at r10-8 (r6 ctx, r7 pid_tgid; the stack below r10-64 is free);
        `prelude(asm)` is emitted before the walk (capture/bpf_latency.py:
        the entry's time)."""
        a = Asm()
        a.emit(mov(6, 1), call(bpf.GET_CURRENT_PID_TGID), mov(7, 0))
        if tgids is not None:
            unless_traced(a, tgids, 7, -32)
        if armed is not None:
            a.emit(st_imm(10, -32, 0, size=4), ld_map_fd(1, armed.fd), mov(2, 10),
                   alu_imm(ADD, 2, -32), call(bpf.MAP_LOOKUP))
            a.jump(jmp_imm, JEQ, 0, 0, to="out")
            a.emit(ldx(1, 0, 0))
            a.jump(jmp_imm, JEQ, 1, 0, to="out")
        if prelude is not None:
            prelude(a)
        # the count key at r10-24: pid_tgid, probe, kernel stack id, hash
        a.emit(stx(10, -24, 7), st_imm(10, -16, probe_index, size=4),
               st_imm(10, -12, -1, size=4))
        self.walk(a, probe)
        self.store_stack(a, then="stored")
        a.label("stored")
        then(a)
        return self.finish(a, result)

    def walk(self, a: Asm, probe, kernel_stacks=None) -> None:
        """The current task's user stack into the scratch value (r8 = it;
        r6 = ctx): its frames, status and running hash; the kernel stack's
        id at r10-12 (the count key at r10-24 must be laid out). Jumps to
        "out" where it cannot start; the code after it runs at "ended"."""
        m = self.maps
        _lookup0(a, m.scratch, 8, -32)
        a.jump(jmp_imm, JEQ, 8, 0, to="out")
        self._registers(a, probe)
        a.emit(mov_imm(1, 1), stx(8, S_EXACT, 1), stx(8, S_BPOK, 1),
               ld_imm64(1, _FNV_BASIS), stx(8, S_HASH, 1),
               st_imm(8, S_MEND, 0), st_imm(8, S_MSTART, 0), st_imm(8, S_WIN, 0),
               st_imm(8, S_FP_USED, 0),
               ldx(1, 8, S_PC), stx(8, S_FRAMES, 1),
               st_imm(8, S_STACK, 1, size=4), st_imm(8, S_STACK + 4, _RUNNING, size=4))
        a.emit(ldx(1, 8, S_PC))
        self._mix(a, 1)
        if kernel_stacks is not None:
            a.emit(mov(1, 6), ld_map_fd(2, kernel_stacks.fd), mov_imm(3, 0),
                   call(bpf.GET_STACKID))
            a.jump(jmp_imm, JSGE, 0, 0, to="kstack")
            a.emit(mov_imm(0, -1))
            a.label("kstack")
            a.emit(stx(10, -12, 0, size=4))
        # a kernel thread (no mm) has no user stack: an empty one
        a.emit(call(bpf.GET_CURRENT_TASK_BTF), ldx(1, 0, self.off.task_mm))
        a.jump(jmp_imm, JNE, 1, 0, to="walk")
        a.emit(st_imm(8, S_STACK, 0, size=4), st_imm(8, S_STACK + 4, COMPLETE, size=4),
               ld_imm64(1, _FNV_BASIS), stx(8, S_HASH, 1))
        a.jump(bpf.ja, to="ended")
        a.label("walk")
        # the walk: one bpf_loop step per frame
        a.emit(mov_imm(1, MAX_FRAMES - 1))
        a.jump(ld_func, 2, to="step")
        a.emit(mov_imm(3, 0), mov_imm(4, 0), call(BPF_LOOP))
        a.emit(ldx(1, 8, S_STACK + 4, size=4))
        a.jump(jmp_imm, JNE, 1, _RUNNING, to="ended")
        a.emit(st_imm(8, S_STACK + 4, TRUNCATED, size=4))
        a.label("ended")

    def store_stack(self, a: Asm, then: str) -> None:
        """The walked stack's final hash at r10-8 (its status mixed in: a
        cut stack is another stack), its frames in STACKS unless there;
        goes on at label `then` (or "out" with the error counted)."""
        m = self.maps
        a.emit(ldx(1, 8, S_STACK + 4, size=4))
        self._mix(a, 1)
        a.emit(ldx(1, 8, S_HASH), stx(10, -8, 1))
        # STACKS[hash] = the frames, unless there already
        a.emit(ld_map_fd(1, m.stacks.fd), mov(2, 10), alu_imm(ADD, 2, -8),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JNE, 0, 0, to=then)
        a.emit(ld_map_fd(1, m.stacks.fd), mov(2, 10), alu_imm(ADD, 2, -8),
               mov(3, 8), alu_imm(ADD, 3, S_STACK), mov_imm(4, bpf.NOEXIST),
               call(bpf.MAP_UPDATE))
        a.jump(jmp_imm, JEQ, 0, 0, to=then)
        a.jump(jmp_imm, JEQ, 0, -errno.EEXIST, to=then)
        self._error(a, ERR_STACKS_FULL)

    def finish(self, a: Asm, result: int, tail=None) -> tuple:
        """The program's exit, then `tail(asm)` (code reached only by a
        jump, which jumps back to "out"), then the callbacks: (bytes, their
        offsets)."""
        a.label("out")
        a.emit(mov_imm(0, result), exit_())
        if tail is not None:
            tail(a)
        step = len(a)
        a.label("step")
        self._step(a)
        vma = len(a)
        a.label("vma")
        self._vma_callback(a)
        return a.assemble(), (step, vma)

    def _error(self, a: Asm, slot: int) -> None:
        a.emit(st_imm(10, -32, slot, size=4), ld_map_fd(1, self.maps.errors.fd),
               mov(2, 10), alu_imm(ADD, 2, -32), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="out")
        a.emit(mov_imm(1, 1), atomic_add(0, 0, 1))
        a.jump(bpf.ja, to="out")

    @staticmethod
    def _mix(a: Asm, reg: int) -> None:
        """S_HASH = (S_HASH ^ reg) * prime, folded (clobbers r2, r3)."""
        a.emit(ldx(2, 8, S_HASH), alu_reg(XOR, 2, reg), ld_imm64(3, _FNV_PRIME),
               alu_reg(MUL, 2, 3), mov(3, 2), alu_imm(RSH, 3, 29),
               alu_reg(XOR, 2, 3), stx(8, S_HASH, 2))

    def _registers(self, a: Asm, probe, tag: str = "") -> None:
        """S_PC, S_SP, S_BP = the user registers (r6 = ctx, r8 = scratch);
        `tag` keeps the labels of a second copy apart."""
        regs = bpf.PT_REGS
        if isinstance(probe, ProfileProbe):
            a.emit(ldx(1, 6, regs["cs"]), alu_imm(AND, 1, 3))
            a.jump(jmp_imm, JEQ, 1, 0, to=f"{tag}task_regs")
        if isinstance(probe, (UprobeProbe, ProfileProbe)):
            for name, at in (("ip", S_PC), ("sp", S_SP), ("bp", S_BP)):
                a.emit(ldx(1, 6, regs[name]), stx(8, at, 1))
            if isinstance(probe, UprobeProbe):
                return
            a.jump(bpf.ja, to=f"{tag}have_regs")
        a.label(f"{tag}task_regs")
        a.emit(call(bpf.GET_CURRENT_TASK_BTF), mov(1, 0), call(bpf.TASK_PT_REGS))
        for name, at in (("ip", S_PC), ("sp", S_SP), ("bp", S_BP)):
            a.emit(ldx(1, 0, regs[name]), stx(8, at, 1))
        a.label(f"{tag}have_regs")

    # -- one frame: bpf_loop's callback (index, ctx) -> 0 go on, 1 stop --------
    def _step(self, a: Asm) -> None:
        m = self.maps
        _lookup0(a, m.scratch, 6)
        a.jump(jmp_imm, JNE, 6, 0, to="s_have")
        a.emit(mov_imm(0, 1), exit_())
        a.label("s_have")
        # q: the pc itself, or the call instruction before a return address
        a.emit(ldx(1, 6, S_PC), ldx(2, 6, S_EXACT), alu_imm(XOR, 2, 1),
               alu_reg(SUB, 1, 2), stx(6, S_Q, 1))
        a.emit(ldx(2, 6, S_MSTART))
        a.jump(jmp_reg, JLT, 1, 2, to="s_find")
        a.emit(ldx(2, 6, S_MEND))
        a.jump(jmp_reg, JLT, 1, 2, to="s_mapped")
        a.label("s_find")
        self._find_mapping(a)
        a.label("s_mapped")
        # vaddr = q + adj; the last row at or below it
        a.emit(ldx(1, 6, S_Q), ldx(2, 6, S_ADJ), alu_reg(ADD, 1, 2),
               stx(6, S_VADDR, 1), st_imm(6, S_LO, 0), ldx(1, 6, S_NROWS),
               stx(6, S_HI, 1))
        # narrowed to the rows of vaddr's page by the page index, if it has one
        a.emit(ldx(1, 6, S_VADDR), alu_imm(RSH, 1, PAGE_SHIFT), ldx(2, 6, S_PBASE),
               alu_reg(SUB, 1, 2), ldx(2, 6, S_NPAGES))
        a.jump(jmp_imm, JEQ, 2, 0, to="s_whole")
        a.emit(alu_imm(SUB, 2, 1))
        a.jump(jmp_reg, JGE, 1, 2, to="s_whole")
        a.emit(ldx(2, 6, S_PSLOT), alu_reg(ADD, 2, 1), stx(10, -8, 2, size=4),
               alu_imm(ADD, 2, 1), stx(10, -12, 2, size=4),
               ld_map_fd(1, m.pages.fd), mov(2, 10), alu_imm(ADD, 2, -8),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="s_whole")
        a.emit(ldx(1, 0, 0, size=4), stx(6, S_LO, 1),
               ld_map_fd(1, m.pages.fd), mov(2, 10), alu_imm(ADD, 2, -12),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="s_whole_reset")
        a.emit(ldx(1, 0, 0, size=4), alu_imm(ADD, 1, 1), stx(6, S_HI, 1))
        a.jump(bpf.ja, to="s_whole")
        a.label("s_whole_reset")
        a.emit(st_imm(6, S_LO, 0))
        a.label("s_whole")
        a.emit(mov_imm(7, SEARCH_STEPS))
        a.label("s_search")
        a.emit(ldx(1, 6, S_LO), ldx(2, 6, S_HI))
        a.jump(jmp_reg, JGE, 1, 2, to="s_searched")
        a.jump(jmp_imm, JEQ, 7, 0, to="s_searched")
        a.emit(alu_imm(SUB, 7, 1), alu_reg(ADD, 1, 2), alu_imm(RSH, 1, 1),
               stx(10, -16, 1), ldx(2, 6, S_FIRST), alu_reg(ADD, 2, 1),
               stx(10, -8, 2, size=4), ld_map_fd(1, m.rows.fd), mov(2, 10),
               alu_imm(ADD, 2, -8), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="s_searched")
        a.emit(ldx(1, 0, 0, size=4), ldx(2, 6, S_VADDR), ldx(3, 10, -16))
        a.jump(jmp_reg, JGT, 1, 2, to="s_left")
        a.emit(alu_imm(ADD, 3, 1), stx(6, S_LO, 3))
        a.jump(bpf.ja, to="s_search")
        a.label("s_left")
        a.emit(stx(6, S_HI, 3))
        a.jump(bpf.ja, to="s_search")
        a.label("s_searched")
        a.emit(ldx(1, 6, S_LO))
        a.jump(jmp_imm, JEQ, 1, 0, to="s_gap")
        a.emit(ldx(2, 6, S_FIRST), alu_reg(ADD, 2, 1), alu_imm(SUB, 2, 1),
               stx(10, -8, 2, size=4), ld_map_fd(1, m.rows.fd), mov(2, 10),
               alu_imm(ADD, 2, -8), call(bpf.MAP_LOOKUP), mov(7, 0))
        a.jump(jmp_imm, JEQ, 7, 0, to="s_gap")
        # r7 = the row; the CFA by its kind
        a.label("s_row")
        a.emit(ldx(1, 7, 4, size=1), ldx(2, 7, 8, size=4))
        _sext32(a, 2)
        a.jump(jmp_imm, JEQ, 1, K_SP, to="s_sp")
        a.jump(jmp_imm, JEQ, 1, K_BP, to="s_bp")
        a.jump(jmp_imm, JEQ, 1, K_PLT, to="s_plt")
        a.jump(jmp_imm, JEQ, 1, K_END, to="s_end")
        a.jump(jmp_imm, JEQ, 1, K_SIGNAL, to="s_signal")
        a.jump(jmp_imm, JEQ, 1, K_UNSUPPORTED, to="s_unsupported")
        a.label("s_gap")
        # no CFI, and rbp 0: the outermost frame (the ABI's mark, set by
        # _start), where the stack ends complete, as the copy path ends it
        a.emit(ldx(1, 6, S_BPOK))
        a.jump(jmp_imm, JEQ, 1, 0, to="s_gap_note")
        a.emit(ldx(1, 6, S_BP))
        a.jump(jmp_imm, JEQ, 1, 0, to="s_end")
        a.label("s_gap_note")
        self._stop(a, GAP)
        a.label("s_unsupported")
        self._stop(a, UNSUPPORTED)
        a.label("s_end")
        self._complete(a, "s_end")
        a.label("s_plt")
        a.emit(ldx(1, 6, S_PC), alu_imm(AND, 1, 15), ldx(3, 7, 6, size=2))
        a.jump(jmp_reg, JLT, 1, 3, to="s_sp")
        a.emit(alu_imm(ADD, 2, 8))
        a.label("s_sp")
        a.emit(ldx(1, 6, S_SP), alu_reg(ADD, 1, 2))
        a.jump(bpf.ja, to="s_cfa")
        a.label("s_bp")
        a.emit(ldx(1, 6, S_BPOK))
        a.jump(jmp_imm, JNE, 1, 0, to="s_bp_ok")
        self._stop(a, NO_BP)
        a.label("s_bp_ok")
        a.emit(ldx(1, 6, S_BP), alu_reg(ADD, 1, 2))
        a.label("s_cfa")
        a.emit(stx(6, S_CFA, 1))
        # the return address at CFA - 8
        a.emit(mov(3, 1), alu_imm(SUB, 3, 8))
        self._read_user(a, S_TMP)
        a.jump(jmp_imm, JEQ, 0, 0, to="s_ra")
        self._stop(a, READ_FAILED)
        a.label("s_ra")
        # rbp by the row's rule
        a.emit(ldx(1, 7, 5, size=1), ldx(3, 7, 12, size=4))
        _sext32(a, 3)
        a.jump(jmp_imm, JEQ, 1, BP_SAME, to="s_bp_done")
        a.jump(jmp_imm, JEQ, 1, BP_AT, to="s_bp_at")
        a.jump(jmp_imm, JEQ, 1, BP_AT_BP, to="s_bp_at_bp")
        a.label("s_bp_lost")
        a.emit(st_imm(6, S_BPOK, 0))
        a.jump(bpf.ja, to="s_bp_done")
        a.label("s_bp_at_bp")
        a.emit(ldx(1, 6, S_BPOK))
        a.jump(jmp_imm, JEQ, 1, 0, to="s_bp_lost")
        a.emit(ldx(1, 6, S_BP), alu_reg(ADD, 3, 1))
        a.jump(bpf.ja, to="s_bp_read")
        a.label("s_bp_at")
        a.emit(ldx(1, 6, S_CFA), alu_reg(ADD, 3, 1))
        a.label("s_bp_read")
        self._read_user(a, S_BP)
        a.jump(jmp_imm, JNE, 0, 0, to="s_bp_lost")
        a.emit(st_imm(6, S_BPOK, 1))
        a.label("s_bp_done")
        # the caller: ends at a null return address; a CFA that does not
        # move up would loop
        a.emit(ldx(1, 6, S_TMP))
        a.jump(jmp_imm, JGE, 1, 0x1000, to="s_ra_ok")
        self._complete(a, "s_null_ra")
        a.label("s_ra_ok")
        a.emit(ldx(2, 6, S_CFA), ldx(3, 6, S_SP))
        a.jump(jmp_reg, JGT, 2, 3, to="s_up")
        self._stop(a, NO_PROGRESS)
        a.label("s_up")
        a.emit(stx(6, S_SP, 2), stx(6, S_PC, 1), st_imm(6, S_EXACT, 0))
        a.jump(bpf.ja, to="s_append")
        # a signal frame: the interrupted registers from the ucontext
        a.label("s_signal")
        for at, where in ((_UC_RBP, S_BP), (_UC_RIP, S_PC), (_UC_RSP, S_SP)):
            a.emit(ldx(3, 6, S_SP), alu_imm(ADD, 3, at))
            self._read_user(a, S_TMP)
            a.jump(jmp_imm, JEQ, 0, 0, to=f"s_uc{at}")
            self._stop(a, READ_FAILED)
            a.label(f"s_uc{at}")
            a.emit(ldx(1, 6, S_TMP), stx(6, where, 1))
        a.emit(mov_imm(1, 1), stx(6, S_EXACT, 1), stx(6, S_BPOK, 1))
        a.label("s_append")
        # frames[n] = pc; n += 1; the hash takes the pc
        a.emit(ldx(1, 6, S_STACK, size=4), mov(2, 1), alu_imm(ADD, 2, 1),
               stx(6, S_STACK, 2, size=4), alu_imm(AND, 1, MAX_FRAMES - 1),
               alu_imm(LSH, 1, 3), mov(2, 6), alu_reg(ADD, 2, 1),
               ldx(1, 6, S_PC), stx(2, S_FRAMES, 1))
        a.emit(ldx(2, 6, S_HASH), alu_reg(XOR, 2, 1), ld_imm64(3, _FNV_PRIME),
               alu_reg(MUL, 2, 3), mov(3, 2), alu_imm(RSH, 3, 29),
               alu_reg(XOR, 2, 3), stx(6, S_HASH, 2))
        a.emit(mov_imm(0, 0), exit_())

    def _find_mapping(self, a: Asm) -> None:
        """S_MSTART/S_MEND/S_FIRST/S_NROWS/S_ADJ for the mapping of S_Q, or
        stop. The VMA comes from VMAS, a cache keyed by (mm ctx_id, 2 MiB
        region), else from bpf_find_vma, which in interrupt context (a
        profile's sample) works once per interrupt: the cache lets later
        samples through mappings the earlier ones met."""
        vmas = self.maps.vmas
        # keyed by the mm's ctx_id, not its address: a freed mm_struct is
        # soon another process's (the next exec's, often), and the cached
        # VMAs of the old one would name its files for the new one's code
        a.emit(call(bpf.GET_CURRENT_TASK_BTF), ldx(1, 0, self.off.task_mm),
               ldx(1, 1, self.off.mm_ctx_id),
               stx(10, -64, 1), ldx(1, 6, S_Q), alu_imm(RSH, 1, VMA_REGION_SHIFT),
               stx(10, -56, 1), ld_map_fd(1, vmas.fd), mov(2, 10),
               alu_imm(ADD, 2, -64), call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JEQ, 0, 0, to="s_vma_miss")
        a.emit(ldx(1, 6, S_Q), ldx(2, 0, 0))
        a.jump(jmp_reg, JLT, 1, 2, to="s_vma_miss")
        a.emit(ldx(2, 0, 8))
        a.jump(jmp_reg, JGE, 1, 2, to="s_vma_miss")
        for at in range(0, 40, 8):
            a.emit(ldx(1, 0, at), stx(10, -48 + at, 1))
        a.jump(bpf.ja, to="s_vma")
        a.label("s_vma_miss")
        a.emit(st_imm(10, -48, 0), st_imm(10, -40, 0), st_imm(10, -32, 0),
               st_imm(10, -24, 0), st_imm(10, -16, 0),
               call(bpf.GET_CURRENT_TASK_BTF), mov(1, 0), ldx(2, 6, S_Q))
        a.jump(ld_func, 3, to="vma")
        a.emit(mov(4, 10), alu_imm(ADD, 4, -48), mov_imm(5, 0), call(bpf.FIND_VMA))
        a.jump(jmp_imm, JEQ, 0, 0, to="s_vma_found")
        a.jump(jmp_imm, JNE, 0, -errno.EBUSY, to="s_no_mapping")
        self._stop(a, VMA_BUSY)
        a.label("s_no_mapping")
        self._stop(a, NO_MAPPING)
        a.label("s_vma_found")
        a.emit(ld_map_fd(1, vmas.fd), mov(2, 10), alu_imm(ADD, 2, -64), mov(3, 10),
               alu_imm(ADD, 3, -48), mov_imm(4, 0), call(bpf.MAP_UPDATE))
        a.label("s_vma")
        a.emit(ldx(1, 10, -16))
        a.jump(jmp_imm, JNE, 1, 0, to="s_file")
        # code without a file (a JIT's): no rows to find, its frame pointer
        # is followed (FP_ROW), as the copy path's unwinder does; nothing
        # of this mapping is cached, each such frame comes here again
        a.emit(st_imm(6, S_MSTART, 0), st_imm(6, S_MEND, 0), st_imm(10, -8, 0, size=4),
               ld_map_fd(1, self.maps.fp_row.fd), mov(2, 10), alu_imm(ADD, 2, -8),
               call(bpf.MAP_LOOKUP), mov(7, 0))
        a.jump(jmp_imm, JEQ, 7, 0, to="s_no_fp_row")
        a.emit(st_imm(6, S_FP_USED, 1))
        a.jump(bpf.ja, to="s_row")
        a.label("s_no_fp_row")
        self._stop(a, NO_FILE)
        a.label("s_file")
        a.emit(ld_map_fd(1, self.maps.objects.fd), mov(2, 10), alu_imm(ADD, 2, -24),
               call(bpf.MAP_LOOKUP))
        a.jump(jmp_imm, JNE, 0, 0, to="s_object")
        self._stop(a, NO_TABLE)
        a.label("s_object")
        # adj = (vaddr - file offset) + pgoff * PAGE - start
        a.emit(ldx(1, 0, 16, size=4), stx(6, S_PSLOT, 1), ldx(1, 0, 20, size=4),
               stx(6, S_PBASE, 1), ldx(1, 0, 24, size=4), stx(6, S_NPAGES, 1))
        a.emit(ldx(1, 0, 0, size=4), stx(6, S_FIRST, 1), ldx(1, 0, 4, size=4),
               stx(6, S_NROWS, 1), ldx(1, 0, 8), ldx(2, 10, -32),
               alu_imm(LSH, 2, 12), alu_reg(ADD, 1, 2), ldx(2, 10, -48),
               alu_reg(SUB, 1, 2), stx(6, S_ADJ, 1),
               ldx(1, 10, -48), stx(6, S_MSTART, 1),
               ldx(1, 10, -40), stx(6, S_MEND, 1), ldx(1, 6, S_NROWS))
        a.jump(jmp_imm, JNE, 1, 0, to="s_mapped")
        a.emit(st_imm(6, S_MEND, 0), ldx(1, 6, S_FIRST))   # not cached: each frame says why
        a.jump(jmp_imm, JNE, 1, TABLE_FULL_MARK, to="s_no_cfi")
        self._stop(a, TABLE_FULL)
        a.label("s_no_cfi")
        self._stop(a, NO_CFI)

    def _vma_callback(self, a: Asm) -> None:
        """bpf_find_vma's callback (task, vma, ctx): ctx[0..5] = vm_start,
        vm_end, vm_pgoff, dev, inode (0, 0 for memory without a file)."""
        o = self.off
        a.emit(ldx(1, 2, o.vm_start), stx(3, 0, 1), ldx(1, 2, o.vm_end), stx(3, 8, 1),
               ldx(1, 2, o.vm_pgoff), stx(3, 16, 1), ldx(1, 2, o.vm_file))
        a.jump(jmp_imm, JNE, 1, 0, to="v_file")
        # no file: the vDSO (its start is mm->context.vdso), or anonymous code
        a.emit(ldx(4, 2, o.vm_mm))
        a.jump(jmp_imm, JEQ, 4, 0, to="v_out")
        a.emit(ldx(4, 4, o.mm_vdso), ldx(5, 3, 0))
        a.jump(jmp_reg, JNE, 4, 5, to="v_out")
        a.emit(st_imm(3, 32, VDSO_KEY[1]))
        a.jump(bpf.ja, to="v_out")
        a.label("v_file")
        a.emit(ldx(1, 1, o.f_inode))
        a.jump(jmp_imm, JEQ, 1, 0, to="v_out")
        a.emit(ldx(4, 1, o.i_ino), stx(3, 32, 4), ldx(1, 1, o.i_sb))
        a.jump(jmp_imm, JEQ, 1, 0, to="v_out")
        a.emit(ldx(1, 1, o.s_dev, size=4), stx(3, 24, 1))
        a.label("v_out")
        a.emit(mov_imm(0, 0), exit_())

    def _read_user(self, a: Asm, into: int) -> None:
        """scratch[into] = the user word at r3; r0 = 0 on success. Served
        from a copy of the stack window at S_WIN when it holds the word:
        a copy from user memory costs the same for 8 bytes as for
        WINDOW (its checks dominate), and a walk reads nearby words."""
        self._reads += 1
        hit, miss, done = (f"r{self._reads}_{w}" for w in ("hit", "miss", "done"))
        a.emit(mov(1, 3), ldx(2, 6, S_WIN), alu_reg(SUB, 1, 2))
        a.jump(jmp_imm, JGT, 1, WINDOW - 8, to=miss)
        a.label(hit)
        a.emit(mov(2, 6), alu_reg(ADD, 2, 1), ldx(1, 2, S_WINBUF), stx(6, into, 1),
               mov_imm(0, 0))
        a.jump(bpf.ja, to=done)
        a.label(miss)                       # refill the window from r3
        a.emit(stx(10, -24, 3), mov(1, 6), alu_imm(ADD, 1, S_WINBUF),
               mov_imm(2, WINDOW), call(bpf.PROBE_READ_USER), ldx(3, 10, -24))
        a.jump(jmp_imm, JNE, 0, 0, to=f"{miss}_one")
        a.emit(stx(6, S_WIN, 3), mov_imm(1, 0))
        a.jump(bpf.ja, to=hit)
        a.label(f"{miss}_one")              # near the stack's end: one word
        a.emit(st_imm(6, S_WIN, 0), mov(1, 6), alu_imm(ADD, 1, into), mov_imm(2, 8),
               call(bpf.PROBE_READ_USER))
        a.label(done)

    @staticmethod
    def _stop(a: Asm, status: int) -> None:
        a.emit(st_imm(6, S_STACK + 4, status, size=4), mov_imm(0, 1), exit_())

    def _complete(self, a: Asm, tag: str) -> None:
        """The walk reached the stack's end: COMPLETE, or THROUGH_JIT when
        a frame without a file was walked on its frame pointer (its note)."""
        a.emit(ldx(1, 6, S_FP_USED))
        a.jump(jmp_imm, JNE, 1, 0, to=f"{tag}_jit")
        self._stop(a, COMPLETE)
        a.label(f"{tag}_jit")
        self._stop(a, THROUGH_JIT)


# --- the maps, and the objects loaded into them --------------------------------

class UnwindMaps(bpf.MapSet):
    """The unwinder's maps; `rows_capacity` bounds the rows of every object
    together (16 bytes each), `stacks` the distinct stacks."""

    def __init__(self, rows_capacity: int, stacks: int, counts: int,
                 objects: int = 4096, vmas: int = 16384, pages_capacity: int = 1 << 18):
        super().__init__()
        # the kernel zeroes the rows' 16 MiB (~4 ms) on the other CPU while
        # this thread makes the rest, and the run sets up the rest: see rows
        obj = unwind_object()
        self._rows_job = InBackground(obj.make_map, "rows", rows_capacity,
                                      flags=bpf.F_MMAPABLE)   # filled by a copy
        self._rows = None
        self._rows_lock = threading.Lock()     # the program's thread or this one
        try:
            self.pages = self._keep(obj.make_map("pages", pages_capacity))
            self.objects = self._keep(obj.make_map("objects", objects))
            self.vmas = self._keep(obj.make_map("vmas", vmas))
            self.scratch = self._keep(obj.make_map("scratch", value_size=SCRATCH_SIZE))
            # elements made as stacks come (Linux 6.1+ lets tracing programs
            # use such maps): preallocating 16 MiB cost ~3.5 ms of start-up
            self.stacks = self._keep(obj.make_map(
                "stacks", stacks, flags=bpf.F_NO_PREALLOC if bpf.kernel_at_least(6, 1) else 0))
            self.counts = self._keep(obj.make_map("counts", counts))
            self.errors = self._keep(obj.make_map("errors"))
            # the rule for code without a file: CFA = rbp + 16, the return
            # address below it, rbp saved at CFA - 16 (push %rbp; mov %rsp,%rbp)
            self.fp_row = self._keep(obj.make_map("fp_row"))
            self.fp_row.update(bytes(4), ROW.pack(0, K_BP, BP_AT, 0, 16, -16))
        except BaseException:
            self.close()
            raise

    def _keep(self, m: bpf.Map) -> bpf.Map:
        self.all.append(m)
        return m

    def named(self) -> dict:
        """The maps by the names unwind.bpf.c gives them."""
        return {"rows": self.rows, "pages": self.pages, "objects": self.objects,
                "vmas": self.vmas, "scratch": self.scratch, "stacks": self.stacks,
                "counts": self.counts, "errors": self.errors, "fp_row": self.fp_row}

    @property
    def rows(self) -> bpf.Map:
        """The rows' array, waited for at first use (a program's code or an
        object's rows), so the maps' other users are set up meanwhile."""
        with self._rows_lock:
            if self._rows is None:
                self._rows = self._rows_job.result()
                self.all.append(self._rows)
        return self._rows

    def close(self) -> None:
        if self._rows is None:              # never asked for: still made, or failed
            made = self._rows_job.result(quiet=True)
            if made is not None:
                made.close()
            self._rows = False              # closed; never made again
        super().close()

def stack_chain(maps: UnwindMaps, h: int) -> bytes:
    """The callchain (u64 frames, a cut stack's marker last) stored in
    STACKS under hash `h`."""
    raw = maps.stacks.lookup(_U64.pack(h))
    if raw is None:
        return _U64.pack(KERNEL_UNWIND_STOP + READ_FAILED)
    n, status = STACK_HEAD.unpack_from(raw)
    n = min(n, MAX_FRAMES)
    chain = bytes(raw[STACK_HEAD.size:STACK_HEAD.size + 8 * n])
    if status not in (COMPLETE, NO_PROGRESS):
        chain += _U64.pack(KERNEL_UNWIND_STOP + status)
    return chain


TableSource = Callable[[ElfImage], object]   # -> PackedRows (data, len), or None


class UnwindObjects:
    """Loads objects' rows into the maps, once per (dev, inode): a library
    shared by many processes is loaded once. `tables(image)` builds the
    rows (unwind/tables.for_image); `bytes_loaded` reports the table
    memory. An object whose rows do not fit is entered with no rows and
    TABLE_FULL_MARK, so the stacks through it end saying so."""

    def __init__(self, maps: UnwindMaps, tables: TableSource):
        self.maps = maps
        self.tables = tables
        self.next_row = 0
        self.next_page = 0
        self.loaded: dict = {}          # (dev, ino) -> (path, rows)

    def add_vdso(self) -> None:
        """Load the rows of this kernel's vDSO (ustack's copy of it)."""
        path = vdso_file()
        if path is not None:
            self.add_path(path, VDSO_KEY)

    def add_path(self, path: str, key: tuple | None = None) -> None:
        """Load the rows of the object at `path` (a host path), if new;
        `key`: its OBJECTS key, else its (dev, inode)."""
        also = ()
        if key is None:
            try:
                st = os.stat(path)
            except OSError:
                return
            key = (kernel_dev(st.st_dev), st.st_ino)
            # a file on a container's overlayfs: the kernel's vma holds the
            # backing file (its device), stat() the overlay's
            also = [(kernel_dev(d), st.st_ino) for d in backing_devices(st.st_dev)]
        if key in self.loaded:
            return
        first, n, adjust, page_slot, first_page, npages = 0, 0, 0, 0, 0, 0
        try:
            image = ElfImage.open(path)
            packed = self.tables(image)
            segs = image.executable_segments()
        except Exception:                # unreadable: the stack says "no CFI"
            packed, segs = None, []
        if packed is not None and segs:
            vaddr, offset, _size = segs[0]
            adjust = vaddr - offset
            n = len(packed)
            if self.next_row + n > self.maps.rows.max_entries:
                first, n = TABLE_FULL_MARK, 0     # its frames' stacks say so
            else:
                first = self.next_row
                self._write_rows(first, packed.data, n)
                self.next_row += n
                pages = packed.pages()
                if self.next_page + len(pages) // 4 <= self.maps.pages.max_entries:
                    page_slot, first_page = self.next_page, packed.first_page
                    npages = len(pages) // 4
                    self.maps.pages.update_batch(
                        array("I", range(page_slot, page_slot + npages)).tobytes(), pages)
                    self.next_page += npages      # else: whole-object searches
        self.loaded[key] = (path, n)
        for k in (key, *also):
            self.maps.objects.update(OBJ_KEY.pack(*k), OBJ_VALUE.pack(
                first, n, adjust, page_slot, first_page, npages, 0))

    def _write_rows(self, first: int, data: bytes, n: int) -> None:
        with self.maps.rows.values_view() as rows:
            rows[first * ROW_SIZE:(first + n) * ROW_SIZE] = data[:n * ROW_SIZE]

    def add_mapping(self, mapping, pid: int) -> None:
        """Load the object of a mapping an MMAP2 record announced."""
        if mapping.path.startswith("/") and not mapping.host_path:
            mapping = Mapping(mapping.start, mapping.end, mapping.pgoff, mapping.path,
                              procfs.host_path(pid, mapping.path, mapping.start,
                                               mapping.end))
        path = object_path(mapping)
        if path is not None:
            self.add_path(path)

    @property
    def bytes_loaded(self) -> int:
        return self.next_row * ROW_SIZE


def objects_of_target(target, probes: list) -> list:
    """Host paths of the objects to load before the run starts: what the
    traced process maps now (-p), what a launched command will map before
    main() (-c: its executable's load closure), what every process maps
    (system-wide); plus the probed binaries."""
    paths: list = [p.path for p in probes if isinstance(p, UprobeProbe)]
    if target.scope == "command":
        for exe in _programs_named(target.argv):
            paths += needed.load_closure(exe)
    pids = [target.pid] if target.scope == "pid" else (
        procfs.pids() if target.scope == "system" else [])
    for pid in pids:
        for m in procfs.executable_mappings(pid):
            path = object_path(m)
            if path is not None:
                paths.append(path)
    return list(dict.fromkeys(paths))


def _programs_named(argv: list) -> list:
    """The command's executable, and the ELF programs its words name (the
    X of `sh -c 'exec X …'`): a program exec'd later than the run's start
    is unwound through only once its rows are loaded, which the MMAP2
    record does too late for its first events."""
    found = [process.executable(argv)]
    for arg in argv[1:]:
        try:
            words = shlex.split(arg)
        except ValueError:
            continue
        for word in words:
            path = word if word.startswith("/") else (
                process.which(word) if "/" not in word and word.isidentifier() else None)
            if path and os.path.isfile(path) and _is_elf(path):
                found.append(path)
    return [p for p in dict.fromkeys(found) if p]


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


# --- the counter: BpfCounter's events and attachment, this program -------------

DEFAULT_ROWS = 1 << 20            # 16 MiB of rows: libc is 28 k rows


class UnwindCounter(BpfCounter):
    """Counts stacks unwound in the kernel; attaches like BpfCounter (one
    program per trace event, one per sampling event). `ring_bytes`: a ring
    of that size, where the programs defer the stacks they cannot unwind
    yet (_defer); with `trace`, where they write every event's record
    instead of counting it; `fetches`: per probe, its fetch-args
    (bpf_fetchargs.FetchArgs) or None, written into trace's records."""

    def __init__(self, probes: list, tables: TableSource, *,
                 stack_storage: int, kernel: bool = False, filter_tgid=None,
                 rows: int = DEFAULT_ROWS, ring_bytes: int = 0, trace: bool = False,
                 fetches: tuple = ()):
        self._no_maps_yet(probes, kernel)
        self.verified: dict = {}         # probe index -> instructions the verifier processed
        self.fetches = tuple(fetches)
        try:
            self.unwind_maps = UnwindMaps(rows, stack_storage,
                                          max(MIN_COUNT_ENTRIES, 2 * stack_storage))
            self.maps.append(self.unwind_maps)      # closed with the counter's maps
            self.kstacks = None
            if kernel:          # kernel stacks: bpf_get_stackid, read by stack_bytes()
                self.max_depth = max(1, min(pe.max_stack(), 127))
                self.kstacks = self.stacks = self._map(
                    bpf.MAP_STACK_TRACE, 4, 8 * self.max_depth, stack_storage,
                    "ustack_kstacks")
            self.ring = None
            self.trace = trace and bool(ring_bytes)
            if ring_bytes:
                self.ring = bpf.RingBuf(ring_bytes, "ustack_uwring")
            self.objects = UnwindObjects(self.unwind_maps, tables)   # rows: open()
            self.program = UnwindProgram(self.unwind_maps, Offsets.of_this_kernel())
            self.follow_if_traced(filter_tgid)
        except BaseException:
            self.close()
            raise

    def _program(self, index: int, probe) -> int:
        fetch = self.fetches[index] if self.trace and index < len(self.fetches) else None
        fetch_maps = self._fetch_maps() if fetch is not None else {}
        fd = load_program(
            "unwind_trace" if self.trace else "unwind_count", self.unwind_maps, index, probe,
            kernel_stacks=self.kstacks, ring=self.ring,
            armed=None if isinstance(probe, ProfileProbe) else self.armed,
            tgids=self.tgids if isinstance(probe, TracepointProbe) else None,
            fetch=fetch_maps, name=f"ustack_uw{index}")
        self.prog_fds.append(fd)
        try:
            self.verified[index] = bpf.verified_insns(fd)
        except OSError:
            pass
        if fetch is not None:
            self._load_fetch(index, probe, fetch, fetch_maps)
        return fd

    def _fetch_maps(self) -> dict:
        """A probe's array of fetch-args programs; the deferred records'
        scratch, shared by the probes."""
        obj = unwind_object()
        if getattr(self, "_deferred", None) is None:
            self._deferred = obj.make_map("deferred_scratch")
            self.maps.append(self._deferred)
        progs = obj.make_map("fetch_args")
        self.maps.append(progs)
        return {"fetch_args": progs, "deferred_scratch": self._deferred}

    def _load_fetch(self, index: int, probe, fetch, maps: dict) -> None:
        """The probe's fetch-args programs (bpf_fetchargs.tail_programs),
        where its trace program goes on."""
        obj = unwind_object()
        walk = obj.layout("walk").offsets
        slots = obj.enum("fetch_slot")
        contract = fetch.contract(
            scratch=self.unwind_maps.scratch, deferred=maps["deferred_scratch"],
            ring=self.ring, errors=self.unwind_maps.errors, fetch_args=maps["fetch_args"],
            record_at=walk["rec.time"], record_size=RECORD.size,
            frames_count_at=walk["rec.head.frames"], frames_at=walk["frame"],
            max_frames=MAX_FRAMES, deferred_size=DEFER_RECORD, ring_full=ERR_RING_FULL,
            undeferred=ERR_UNDEFERRED, stream_slot=slots["FETCH_STREAM"],
            result=program_result(probe))
        codes = fetch.tail_programs(contract, Offsets.of_this_kernel())
        for slot, (code, functions) in zip(("FETCH_STREAM", "FETCH_DEFERRED"), codes):
            fd = bpf.load_program(prog_type_of(probe), code, f"ustack_fa{index}",
                                  functions=functions)
            self.prog_fds.append(fd)
            maps["fetch_args"].update(slots[slot].to_bytes(4, "little"),
                                      fd.to_bytes(4, "little"))

    def load(self, index: int, prog_type: int, code: bytes, functions: tuple,
             name: str) -> int:
        """Load probe `index`'s program (kept, closed with the counter)."""
        fd = bpf.load_program(prog_type, code, name, functions=functions)
        self.prog_fds.append(fd)
        try:
            self.verified[index] = bpf.verified_insns(fd)
        except OSError:
            pass
        return fd

    def unwound(self, reset: bool = False) -> list:
        """(pid, tid, probe, callchain bytes, kernel stack id, count) of every
        stack counted; a stack cut short ends with its reason's marker."""
        found: dict = {}
        out = []
        for k, v in self.unwind_maps.counts.items():
            pid_tgid, probe, kstack, h = COUNT_KEY.unpack(k)
            chain = found.get(h)
            if chain is None:
                chain = found[h] = self._chain(h)
            out.append((pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, probe, chain, kstack,
                        _U64.unpack(v)[0]))
            if reset:
                self.unwind_maps.counts.delete(k)
        return out

    def _chain(self, h: int) -> bytes:
        return stack_chain(self.unwind_maps, h)

    def errors_seen(self) -> list:
        return [_U64.unpack(self.unwind_maps.errors.lookup(i.to_bytes(4, "little")))[0]
                for i in range(ERR_SLOTS)]

    def close(self) -> None:
        super().close()
        if getattr(self, "ring", None) is not None:
            self.ring.close()
            self.ring = None


def regs_source(probe) -> str:
    """Where the program finds the event's user registers (enum regs_source)."""
    if isinstance(probe, UprobeProbe):
        return "REGS_CTX"
    return "REGS_SAMPLE" if isinstance(probe, ProfileProbe) else "REGS_TASK"


def kernel_rodata(offsets: Offsets) -> dict:
    """unwind.h's kernel field offsets, from this kernel's BTF."""
    return {name: getattr(offsets, name) for name in (
        "task_mm", "mm_ctx_id", "mm_vdso", "vm_start", "vm_end", "vm_pgoff", "vm_file",
        "vm_mm", "f_inode", "i_ino", "i_sb", "s_dev")}


def load_program(program: str, maps: UnwindMaps, index: int, probe, *, kernel_stacks=None,
                 ring=None, armed=None, tgids=None, fetch: dict | None = None,
                 name: str = "ustack_uw") -> int:
    """unwind.bpf.c's `program` for probe `index` (its fd): unwind_count
    counts each stack, unwind_trace writes each to `ring`; `ring`: where a
    walk that ended DEFERRABLE goes. `fetch`: the fetch_args and
    deferred_scratch maps of a probe with fetch-args (trace)."""
    obj = unwind_object()
    named = maps.named()
    for key, m in (("kernel_stacks", kernel_stacks), ("ring", ring), ("armed", armed),
                   ("tgids", tgids), *(fetch or {}).items()):
        if m is not None:
            named[key] = m
    bits = obj.enum("unwind_option")
    wanted = {"UW_ONLY_TRACED": tgids is not None, "UW_WAIT_FOR_EXEC": armed is not None,
              "UW_KERNEL_STACK": kernel_stacks is not None, "UW_DEFER": ring is not None,
              "UW_FETCH_ARGS": bool(fetch)}
    before = set(named)
    try:
        return obj.load(program, named, {
            "probe_index": index, "result": program_result(probe),
            "options": sum(bits[k] for k, on in wanted.items() if on),
            "regs_source": obj.enum("regs_source")[regs_source(probe)],
            **kernel_rodata(Offsets.of_this_kernel())}, prog_type_of(probe), name)
    finally:
        for key in set(named) - before:      # declared maps a probe does not use
            named[key].close()


class RingChunk(bytes):
    """Records read from the unwinder's ring (RingBuf.read), told apart
    from the perf buffers' chunks in the capture's stream."""


def ring_samples(chunk: bytes, samples: list, offset: int, limit: int,
                 kernel_stack: Callable[[int], bytes] = lambda _id: b"",
                 fetches: tuple = (), read_file=None) -> int:
    """Append a RawSample per record of a RingChunk from `offset`, for
    about `limit` bytes; returns the offset reached. A deferred record
    becomes a DWARF sample (regs and stack, as the copy path's), its
    kernel frames from `kernel_stack(id)`. `fetches[probe]` decodes the
    values of the probe's fetch-args, which end each record (`read_file`:
    see bpf_fetchargs.FetchArgs.decode)."""
    end = min(len(chunk), offset + limit)
    while offset < end:
        n = struct.unpack_from("<I", chunk, offset)[0]
        rec = offset + 4
        t, pid_tgid, probe, cpu, nframes, status = RECORD.unpack_from(chunk, rec)
        if status == DEFERRED:
            ip, sp, bp, kstack, size = DEFER.unpack_from(chunk, rec + RECORD.size)
            at = rec + RECORD.size + DEFER.size
            fetch = fetches[probe] if probe < len(fetches) else None
            samples.append(RawSample(
                probe, pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t, cpu,
                regs={"ip": ip, "sp": sp, "bp": bp},
                stack=chunk[at:at + min(size, DEFER_STACK)],
                args=fetch.decode(chunk, rec + DEFER_RECORD, rec + n, read_file)
                if fetch else (),
                kernel=kernel_stack(kstack) if kstack >= 0 else b""))
            offset = rec + n
            continue
        nframes = min(nframes, MAX_FRAMES)
        frames_end = rec + RECORD.size + 8 * nframes
        chain = chunk[rec + RECORD.size:frames_end]
        if status not in (COMPLETE, NO_PROGRESS):
            chain += _U64.pack(KERNEL_UNWIND_STOP + status)
        fetch = fetches[probe] if probe < len(fetches) else None
        samples.append(RawSample(probe, pid_tgid >> 32, pid_tgid & 0xFFFFFFFF, t, cpu,
                                 bytes(chain), args=fetch.decode(chunk, frames_end, rec + n,
                                                                 read_file) if fetch else ()))
        offset = rec + n
    return offset


_support: dict = {}                  # probe kind -> None | why not (per process)


def why_unavailable(probes: list) -> str | None:
    """None if this kernel loads the unwinder for every kind of probe in
    `probes`, else why not (the verifier's words, or what is missing):
    tried once per kind with small maps, so a refusal is known before the
    run commits to this path."""
    for probe in probes:
        kind = type(probe)
        if kind not in _support:
            _support[kind] = None if _accepted_before(kind) else _try_load(probe)
        if _support[kind] is not None:
            return _support[kind]
    return None


def _verdict_file(kind) -> str:
    """Where this kernel's acceptance of this very program is remembered:
    keyed by the kernel (release, build) and this module's source, so a new
    kernel or a changed program is tried again (~50 ms before a run starts)."""
    with open(__file__, "rb") as f, open(bpf_programs.object_path("unwind"), "rb") as o:
        source = objcache.digest(f.read() + o.read())
    key = f"{os.uname().release}\0{os.uname().version}\0{kind.__name__}\0{source}"
    return objcache.cache_file("btf", btf.VMLINUX, None,
                               objcache.digest(key.encode()), "accepted1")


def _accepted_before(kind) -> bool:
    """Whether the verifier took this program on this kernel before."""
    try:
        return objcache.read(_verdict_file(kind)) == b"ok"
    except OSError:
        return False


def _try_load(probe) -> str | None:
    """The program as count/profile load it (deferring to a ring)."""
    maps = ring = None
    try:
        maps = UnwindMaps(16, 16, 16, objects=16, vmas=16, pages_capacity=16)
        ring = bpf.RingBuf(1 << 14, "ustack_uwtry")
        os.close(load_program("unwind_count", maps, 0, probe, ring=ring, name="ustack_uwtry"))
    except UstackError as e:
        return str(e)
    finally:
        if ring is not None:
            ring.close()
        if maps is not None:
            maps.close()
    try:
        objcache.write(_verdict_file(type(probe)), b"ok")
    except OSError:
        pass
    return None
