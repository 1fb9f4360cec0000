"""bpf(2) through ctypes: maps, program loading, and eBPF instruction builders.

There is no clang, libbpf or bcc at run time: most programs are BPF C built
ahead into objects (src/ustack/bpf, loaded by kernel/bpf_object.py); the
rest (a trace's fetch-args, compiled per run) is assembled from the
readable builders here (one function per instruction kind).
Both load with BPF_PROG_LOAD. Layouts follow include/uapi/linux/bpf.h;
the attr structs are prefixes of `union bpf_attr` (the kernel zero-fills
the fields a shorter struct leaves out)."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct

from ..model import UstackError
from .shared_word import SharedWord

NR_BPF = 321                      # x86-64

# commands
MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM = 0, 1, 2, 3
MAP_GET_NEXT_KEY, PROG_LOAD = 4, 5
MAP_LOOKUP_AND_DELETE_ELEM = 21
MAP_UPDATE_BATCH = 26

OBJ_GET_INFO_BY_FD = 15

# map types
MAP_HASH, MAP_ARRAY, MAP_PERCPU_ARRAY, MAP_STACK_TRACE, MAP_LRU_HASH = 1, 2, 6, 7, 9
MAP_PERCPU_HASH = 5
MAP_PROG_ARRAY = 3                # tail calls' targets
MAP_ARRAY_OF_MAPS = 12            # its values: inner maps' fds, made like its template
# program types (and what their context is)
PROG_KPROBE = 2                   # pt_regs: tracefs uprobes too
PROG_TRACEPOINT = 5               # tracepoint record; its first word points to pt_regs
PROG_PERF_EVENT = 7               # bpf_perf_event_data: pt_regs first
PROG_RAW_TRACEPOINT = 17          # the tracepoint's own arguments, as u64s

# helpers (enum bpf_func_id): FN_ as the kernel's BPF_FUNC_, apart from
# the commands of the same names above (bpf(2)'s BPF_MAP_LOOKUP_ELEM, ...)
FN_MAP_LOOKUP_ELEM, FN_MAP_UPDATE_ELEM, FN_MAP_DELETE_ELEM = 1, 2, 3
GET_CURRENT_PID_TGID = 14
GET_STACKID = 27
PROBE_READ_USER, PROBE_READ_KERNEL = 112, 113
# (dst, size, src) -> bytes copied, the NUL included; < 0 on a fault
PROBE_READ_USER_STR, PROBE_READ_KERNEL_STR = 114, 115
GET_CURRENT_COMM = 16             # (buf, size): the task's comm, NUL-padded
GET_CURRENT_TASK_BTF = 158        # the current task_struct, as a BTF pointer
TASK_PT_REGS = 175                # a task's user pt_regs (BTF pointer)
FIND_VMA = 180                    # (task, addr, callback, ctx, flags)

F_USER_STACK = 1 << 8             # bpf_get_stackid: the user stack
NOEXIST = 1                       # map_update_elem: only create
F_MMAPABLE = 1 << 10              # map_create: an ARRAY map user space can mmap
F_NO_PREALLOC = 1                 # map_create: a HASH map's elements made on insert

PERF_EVENT_IOC_SET_BPF = 0x40042408

# x86-64 struct pt_regs offsets (arch/x86/include/asm/ptrace.h)
PT_REGS = {"r15": 0, "r14": 8, "r13": 16, "r12": 24, "bp": 32, "bx": 40,
           "r11": 48, "r10": 56, "r9": 64, "r8": 72, "ax": 80, "cx": 88,
           "dx": 96, "si": 104, "di": 112, "orig_ax": 120, "ip": 128,
           "cs": 136, "flags": 144, "sp": 152, "ss": 160}

# --- instructions --------------------------------------------------------------
# struct bpf_insn { u8 code; u8 dst:4, src:4; s16 off; s32 imm; }
_INSN = struct.Struct("<BBhi")

# classes, sizes, modes, sources, operations
LD, LDX, ST, STX, ALU, JMP, JMP32, ALU64 = range(8)
W, H, B, DW = 0x00, 0x08, 0x10, 0x18
IMM, MEM, ATOMIC = 0x00, 0x60, 0xC0
K, X = 0x00, 0x08
ADD, SUB, MUL, OR, AND, LSH, RSH, MOV = 0x00, 0x10, 0x20, 0x40, 0x50, 0x60, 0x70, 0xB0
JA, JEQ, JGT, JGE, JNE, JSGT, JSGE, CALL, EXIT = (0x00, 0x10, 0x20, 0x30, 0x50,
                                                 0x60, 0x70, 0x80, 0x90)
JSLT, JLT, JLE = 0xC0, 0xA0, 0xB0
XOR, NEG, ARSH = 0xA0, 0x80, 0xC0
DIV = 0x30                        # unsigned
PSEUDO_MAP_FD = 1
PSEUDO_CALL = 1                   # a call's src: a BPF function, imm = relative insn
PSEUDO_FUNC = 4                   # ld_imm64's src: a BPF function's address
_SIZES = {8: DW, 4: W, 2: H, 1: B}


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return _INSN.pack(code, (src << 4) | dst, off, imm)


def mov(dst: int, src_or_imm: int, *, reg: bool = True) -> bytes:
    """dst = src register (reg=True) or an immediate (reg=False), 64 bits."""
    if reg:
        return insn(ALU64 | MOV | X, dst, src_or_imm)
    return insn(ALU64 | MOV | K, dst, imm=src_or_imm)


def mov_imm(dst: int, imm: int) -> bytes:
    return mov(dst, imm, reg=False)


def alu_imm(op: int, dst: int, imm: int) -> bytes:
    """dst op= imm (64 bits): ADD, SUB, RSH, AND, …"""
    return insn(ALU64 | op | K, dst, imm=imm)


def ldx(dst: int, src: int, off: int, size: int = 8) -> bytes:
    """dst = *(size *)(src + off)"""
    return insn(LDX | MEM | _SIZES[size], dst, src, off)


def stx(dst: int, off: int, src: int, size: int = 8) -> bytes:
    """*(size *)(dst + off) = src"""
    return insn(STX | MEM | _SIZES[size], dst, src, off)


def st_imm(dst: int, off: int, imm: int, size: int = 8) -> bytes:
    """*(size *)(dst + off) = imm"""
    return insn(ST | MEM | _SIZES[size], dst, 0, off, imm)


def atomic_add(dst: int, off: int, src: int) -> bytes:
    """lock *(u64 *)(dst + off) += src"""
    return insn(STX | ATOMIC | DW, dst, src, off, ADD)


def jmp_imm(op: int, dst: int, imm: int, off: int) -> bytes:
    """if dst op imm: skip `off` instructions (JEQ, JNE, JSLT, …)."""
    return insn(JMP | op | K, dst, 0, off, imm)


def jmp_reg(op: int, dst: int, src: int, off: int) -> bytes:
    """if dst op src (registers, unsigned for JGT/JGE/JLT/JLE): skip `off`."""
    return insn(JMP | op | X, dst, src, off)


def alu_reg(op: int, dst: int, src: int) -> bytes:
    """dst op= src (64 bits)."""
    return insn(ALU64 | op | X, dst, src)


def ld_imm64(dst: int, value: int) -> bytes:
    """dst = a 64-bit constant: TWO instruction slots."""
    value &= (1 << 64) - 1
    lo, hi = value & 0xFFFFFFFF, value >> 32
    return (insn(LD | DW | IMM, dst, imm=lo - (1 << 32) if lo >> 31 else lo)
            + insn(0, imm=hi - (1 << 32) if hi >> 31 else hi))


def ld_func(dst: int, off: int) -> bytes:
    """dst = the address of the BPF function `off` instructions after the
    next one (a callback for bpf_loop, bpf_find_vma): TWO slots."""
    return insn(LD | DW | IMM, dst, PSEUDO_FUNC, imm=off) + insn(0)


def ja(off: int) -> bytes:
    return insn(JMP | JA, off=off)


def call(helper: int) -> bytes:
    return insn(JMP | CALL, imm=helper)


def exit_() -> bytes:
    return insn(JMP | EXIT)


def ld_map_fd(dst: int, fd: int) -> bytes:
    """dst = the map with this fd: a 64-bit load, so TWO instruction slots."""
    return insn(LD | DW | IMM, dst, PSEUDO_MAP_FD, imm=fd) + insn(0)


class Asm:
    """A program as a list of instructions with named forward jumps, so the
    builders above need no hand-counted offsets:
        a.jump(jmp_imm, JEQ, 0, 0, to="out") … a.label("out")"""

    def __init__(self):
        self.code: list = []            # bytes of 8 or 16 (ld_imm64)
        self._slots = 0                 # instruction slots in code (kept: jumps ask often)
        self._fixups: list = []         # (index, label, make)
        self._labels: dict = {}

    def __len__(self) -> int:
        return self._slots

    def emit(self, *insns: bytes) -> "Asm":
        self.code.extend(insns)
        self._slots += sum(map(len, insns)) // 8
        return self

    def jump(self, make, *args, to: str) -> "Asm":
        """Emit make(*args, off) with off resolved once `to` is placed."""
        self._fixups.append((len(self), to, make, args))
        return self.emit(make(*args, 0))

    def label(self, name: str) -> "Asm":
        self._labels[name] = len(self)
        return self

    def assemble(self) -> bytes:
        raw = bytearray(b"".join(self.code))
        for at, to, make, args in self._fixups:
            code = make(*args, self._labels[to] - at - 1)   # ld_func: 16 bytes
            raw[8 * at:8 * at + len(code)] = code
        return bytes(raw)


# --- the syscall -----------------------------------------------------------------

class _MapCreate(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16)]


class _MapElem(ctypes.Structure):
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _Batch(ctypes.Structure):
    _fields_ = [("in_batch", ctypes.c_uint64), ("out_batch", ctypes.c_uint64),
                ("keys", ctypes.c_uint64), ("values", ctypes.c_uint64),
                ("count", ctypes.c_uint32), ("map_fd", ctypes.c_uint32),
                ("elem_flags", ctypes.c_uint64), ("flags", ctypes.c_uint64)]


class _ProgLoad(ctypes.Structure):
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16),
                ("prog_ifindex", ctypes.c_uint32),
                ("expected_attach_type", ctypes.c_uint32),
                ("prog_btf_fd", ctypes.c_uint32),
                ("func_info_rec_size", ctypes.c_uint32),
                ("func_info", ctypes.c_uint64), ("func_info_cnt", ctypes.c_uint32),
                ("line_info_rec_size", ctypes.c_uint32),
                ("line_info", ctypes.c_uint64), ("line_info_cnt", ctypes.c_uint32)]


class _BtfLoad(ctypes.Structure):
    _fields_ = [("btf", ctypes.c_uint64), ("btf_log_buf", ctypes.c_uint64),
                ("btf_size", ctypes.c_uint32), ("btf_log_size", ctypes.c_uint32),
                ("btf_log_level", ctypes.c_uint32)]


class _ObjInfo(ctypes.Structure):
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_LICENSE = ctypes.create_string_buffer(b"GPL")   # get_stackid is GPL-only
LOG_SIZE = 1 << 20
LOG_LINES = 6                                     # shown on a load failure


def _bpf(cmd: int, attr) -> int:
    ret = _libc.syscall(NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def available() -> bool:
    """Whether this process may create BPF maps (root, a kernel with bpf(2))."""
    try:
        m = Map(MAP_ARRAY, 4, 8, 1, "ustack_probe")
    except UstackError:
        return False
    m.close()
    return True


class Map:
    """One BPF map; keys and values are bytes of the sizes it was made with."""

    def __init__(self, map_type: int, key_size: int, value_size: int,
                 max_entries: int, name: str = "", flags: int = 0, inner_map_fd: int = 0):
        """`inner_map_fd`: a map of maps' template of its inner maps (may
        be closed once this one is made)."""
        attr = _MapCreate(map_type, key_size, value_size, max_entries, flags, inner_map_fd, 0,
                          name.encode()[:15])
        try:
            self.fd = _bpf(MAP_CREATE, attr)
        except OSError as e:
            if e.errno == errno.EPERM:
                raise UstackError("permission denied creating a BPF map: run "
                                  "ustack as root")
            raise UstackError(f"cannot create a BPF map ({name}, {max_entries} "
                              f"entries): {e.strerror}")
        self.key_size, self.value_size = key_size, value_size
        self.max_entries = max_entries

    def write_values(self, at: int, data: bytes) -> None:
        """Write `data` at byte `at` of the values of an ARRAY map made with
        F_MMAPABLE (value i at i * its size rounded up to 8): a copy, where
        BPF_MAP_UPDATE_BATCH costs ~0.2 µs per element. Only the pages
        written are mapped, and only while they are written: a mapping
        kept counts the whole map in this process's RSS (16 MB of rows)."""
        page = mmap.PAGESIZE
        start = at - at % page
        end = -(-(at + len(data)) // page) * page
        with mmap.mmap(self.fd, end - start, mmap.MAP_SHARED,
                       mmap.PROT_READ | mmap.PROT_WRITE, offset=start) as mapped:
            mapped[at - start:at - start + len(data)] = data

    def _elem(self, cmd: int, key: bytes, value=None, flags: int = 0) -> int:
        kbuf = ctypes.create_string_buffer(key, self.key_size)
        attr = _MapElem(self.fd, 0, ctypes.addressof(kbuf),
                        ctypes.addressof(value) if value is not None else 0, flags)
        return _bpf(cmd, attr)

    def _lookup_into(self, key: bytes, size: int, cmd: int = MAP_LOOKUP_ELEM) -> bytes | None:
        """The `size` bytes the kernel gives for `key`, or None if absent."""
        vbuf = ctypes.create_string_buffer(size)
        try:
            self._elem(cmd, key, vbuf)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            raise
        return vbuf.raw

    def lookup(self, key: bytes):
        """The value of `key` as bytes, or None if absent."""
        return self._lookup_into(key, self.value_size)

    def lookup_percpu(self, key: bytes) -> list | None:
        """A per-CPU map's values of `key`, one bytes per possible CPU, or
        None if absent."""
        step = (self.value_size + 7) & ~7
        raw = self._lookup_into(key, step * possible_cpus())
        if raw is None:
            return None
        return [raw[i:i + self.value_size] for i in range(0, len(raw), step)]

    def update(self, key: bytes, value: bytes, flags: int = 0) -> None:
        self._elem(MAP_UPDATE_ELEM, key,
                   ctypes.create_string_buffer(value, self.value_size), flags)

    def update_batch(self, keys: bytes, values: bytes) -> None:
        """Many updates in one call (BPF_MAP_UPDATE_BATCH): `keys` and
        `values` are the keys and values laid end to end."""
        count = len(keys) // self.key_size
        kbuf = ctypes.create_string_buffer(keys, len(keys))
        vbuf = ctypes.create_string_buffer(values, len(values))
        done = 0
        while done < count:           # the kernel may stop early (-EINTR …)
            attr = _Batch(0, 0, ctypes.addressof(kbuf) + done * self.key_size,
                          ctypes.addressof(vbuf) + done * self.value_size,
                          count - done, self.fd, 0, 0)
            try:
                _bpf(MAP_UPDATE_BATCH, attr)
            except OSError as e:
                if e.errno != errno.EINTR or attr.count == 0:
                    raise UstackError(f"cannot fill a BPF map: {e.strerror}")
            done += attr.count

    def take(self, key: bytes):
        """The value of `key`, removed in the same step (a hash map: Linux
        5.14+), or None if absent: a count read then deleted would lose
        what the programs added between the two calls."""
        return self._lookup_into(key, self.value_size, MAP_LOOKUP_AND_DELETE_ELEM)

    def delete(self, key: bytes) -> None:
        try:
            self._elem(MAP_DELETE_ELEM, key)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise

    def keys(self) -> list:
        """Every key, from a snapshot walk with GET_NEXT_KEY."""
        out = []
        nbuf = ctypes.create_string_buffer(self.key_size)
        attr = _MapElem(self.fd, 0, 0, ctypes.addressof(nbuf), 0)
        kbuf = ctypes.create_string_buffer(self.key_size)
        while True:
            try:
                _bpf(MAP_GET_NEXT_KEY, attr)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    return out
                raise
            out.append(nbuf.raw)
            ctypes.memmove(kbuf, nbuf, self.key_size)
            attr.key = ctypes.addressof(kbuf)

    def items(self, take: bool = False) -> list:
        """(key, value) pairs; keys deleted meanwhile are left out. `take`:
        each removed as it is read (take())."""
        read = self.take if take else self.lookup
        out = []
        for k in self.keys():
            v = read(k)
            if v is not None:
                out.append((k, v))
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def possible_cpus() -> int:
    """How many CPUs per-CPU maps hold values for (/sys/devices/system/cpu/possible)."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    return max(int(part.split("-")[-1]) for part in text.split(",")) + 1


class MapSet:
    """Maps made together and closed together (an unwinder's, a latency
    run's): `_map` makes one and keeps it for close()."""

    def __init__(self):
        self.all: list = []

    def _map(self, *args, **kwargs) -> Map:
        m = Map(*args, **kwargs)
        self.all.append(m)
        return m

    def close(self) -> None:
        for m in self.all:
            m.close()
        self.all.clear()


class LoadError(UstackError):
    """The verifier refused a program; the message ends with its log."""


BTF_LOAD = 18
_BTF_HDR = struct.Struct("<HBBIIIII")
_BTF_TYPE = struct.Struct("<III")
_FUNC_INFO = struct.Struct("<II")     # insn_off, type_id


def functions_btf(names: list) -> bytes:
    """A minimal BTF blob that declares each of `names` a static function
    `int f(void)`: the kernel wants BTF func_info for any program with
    BPF-to-BPF functions (callbacks of bpf_find_vma, bpf_loop), and it
    checks no more than this for static ones. Type ids: 1 int, 2 the
    prototype, 3 + i the function names[i]."""
    strings = b"\0int\0" + b"".join(n.encode() + b"\0" for n in names)
    types = (_BTF_TYPE.pack(1, 1 << 24, 4) + struct.pack("<I", (1 << 24) | 32)
             + _BTF_TYPE.pack(0, 13 << 24, 1))
    off = 5
    for n in names:
        types += _BTF_TYPE.pack(off, 12 << 24, 2)
        off += len(n) + 1
    return _BTF_HDR.pack(0xEB9F, 1, 0, _BTF_HDR.size, 0, len(types), len(types),
                         len(strings)) + types + strings


def load_btf(blob: bytes) -> int:
    buf = ctypes.create_string_buffer(blob, len(blob))
    log = ctypes.create_string_buffer(1 << 16)
    attr = _BtfLoad(ctypes.addressof(buf), 0, len(blob), 0, 0)
    try:
        return _bpf(BTF_LOAD, attr)
    except OSError:
        attr.btf_log_buf, attr.btf_log_size, attr.btf_log_level = \
            ctypes.addressof(log), len(log), 1
        try:
            return _bpf(BTF_LOAD, attr)
        except OSError as e:
            raise LoadError(f"the kernel refused BTF for a BPF program: {e.strerror}: "
                            + log.value.decode("utf-8", "replace").strip())


def _prog_info(prog_fd: int) -> bytes:
    """The program's struct bpf_prog_info, as the kernel fills it."""
    info = ctypes.create_string_buffer(256)
    attr = _ObjInfo(prog_fd, 256, ctypes.addressof(info))
    _bpf(OBJ_GET_INFO_BY_FD, attr)
    return info.raw


def verified_insns(prog_fd: int) -> int:
    """How many instructions the verifier processed (bpf_prog_info)."""
    return struct.unpack_from("<I", _prog_info(prog_fd), 216)[0]


def recursion_misses(prog_fd: int) -> int:
    """How many times the kernel did not run the program for an event
    because a BPF program (or a bpf() call) was running on that CPU
    already: trace_call_bpf, behind classic tracepoints and perf-event
    uprobes, skips then and counts it here (Linux 5.12+; 0 before)."""
    return struct.unpack_from("<Q", _prog_info(prog_fd), 208)[0]


def load_program(prog_type: int, code: bytes, name: str = "ustack",
                 functions: tuple = (), attach_type: int = 0) -> int:
    """Load a program and return its fd; on refusal raise LoadError with the
    verifier's last lines (the log is asked for only after a failure, so a
    good program loads without the cost of logging). `functions`: the
    instruction offsets of its BPF-to-BPF functions (callbacks), after the
    main one at 0. `attach_type`: the link it is made for, where the kernel
    checks at load (TRACE_UPROBE_MULTI)."""
    buf = ctypes.create_string_buffer(code)
    attr = _ProgLoad(prog_type, len(code) // 8, ctypes.addressof(buf),
                     ctypes.addressof(_LICENSE), 0, 0, 0, 0, 0,
                     name.encode()[:15])
    attr.expected_attach_type = attach_type
    btf_fd = -1
    if functions:
        starts = (0,) + tuple(functions)
        btf_fd = load_btf(functions_btf([f"f{i}" for i in range(len(starts))]))
        infos = b"".join(_FUNC_INFO.pack(at, 3 + i) for i, at in enumerate(starts))
        info_buf = ctypes.create_string_buffer(infos, len(infos))
        attr.prog_btf_fd, attr.func_info_rec_size = btf_fd, _FUNC_INFO.size
        attr.func_info, attr.func_info_cnt = ctypes.addressof(info_buf), len(starts)
    try:
        return _load(attr, name)
    finally:
        if btf_fd >= 0:
            os.close(btf_fd)


def _load(attr, name: str) -> int:
    try:
        return _bpf(PROG_LOAD, attr)
    except OSError as first:
        if first.errno == errno.EPERM:
            raise LoadError("permission denied loading a BPF program: run "
                            "ustack as root")
        log = ctypes.create_string_buffer(LOG_SIZE)
        attr.log_level, attr.log_size = 1, LOG_SIZE
        attr.log_buf = ctypes.addressof(log)
        try:
            return _bpf(PROG_LOAD, attr)       # loads after all (a transient error)
        except OSError as e:
            lines = log.value.decode("utf-8", "replace").strip().splitlines()
            tail = "\n".join(_with_source_line(lines, LOG_LINES))
            raise LoadError(f"the kernel refused BPF program {name}: "
                            f"{e.strerror}" + (f"\n{tail}" if tail else ""))


def _with_source_line(lines: list, n: int) -> list:
    """The log's last n lines, led by the last C source line the verifier
    named before them ("; if (x) @ counts.bpf.c:61", given with line_info)
    when none of them is one."""
    tail = lines[-n:]
    if not any(line.startswith("; ") for line in tail):
        source = [line for line in lines[:-n] if line.startswith("; ")]
        tail = source[-1:] + tail
    return tail


def load_with_btf(prog_type: int, code: bytes, name: str, btf_fd: int,
                  func_info: bytes, line_info: bytes, attach_type: int = 0) -> int:
    """Load a program with its object's BTF (loaded with load_btf) and its
    func_info and line_info records (bpf_func_info, bpf_line_info: offsets
    in instructions): bpf_loop callbacks need the first, and the second
    puts the C source lines into the verifier's log."""
    buf = ctypes.create_string_buffer(code)
    funcs = ctypes.create_string_buffer(func_info, len(func_info))
    lines = ctypes.create_string_buffer(line_info, len(line_info))
    attr = _ProgLoad(prog_type, len(code) // 8, ctypes.addressof(buf),
                     ctypes.addressof(_LICENSE), 0, 0, 0, 0, 0,
                     name.encode()[:15])
    attr.expected_attach_type = attach_type
    attr.prog_btf_fd = btf_fd
    if func_info:
        attr.func_info_rec_size, attr.func_info = _FUNC_INFO.size, ctypes.addressof(funcs)
        attr.func_info_cnt = len(func_info) // _FUNC_INFO.size
    if line_info:
        attr.line_info_rec_size, attr.line_info = LINE_INFO_SIZE, ctypes.addressof(lines)
        attr.line_info_cnt = len(line_info) // LINE_INFO_SIZE
    return _load(attr, name)


PROG_TEST_RUN = 10


class _TestRun(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32)]


def test_run(prog_fd: int, ctx: bytes = b"") -> int:
    """Run a program once on `ctx` (BPF_PROG_TEST_RUN: raw tracepoint
    programs take their u64 arguments) and return what it returned: runs
    a program's logic through the kernel without an event."""
    buf = ctypes.create_string_buffer(ctx, len(ctx))
    attr = _TestRun(prog_fd, 0, 0, 0, 0, 0, 0, 0, len(ctx), 0,
                    ctypes.addressof(buf) if ctx else 0, 0, 0, 0)
    try:
        _bpf(PROG_TEST_RUN, attr)
    except OSError as e:
        raise UstackError(f"cannot run a BPF program: {e.strerror}")
    return attr.retval


LINE_INFO_SIZE = 16                  # insn_off, file_name_off, line_off, line_col
MAP_FREEZE = 22
F_RDONLY_PROG = 1 << 7               # map_create: programs may only read it


def freeze(m: Map) -> None:
    """Make a map read-only for user space from now (BPF_MAP_FREEZE): with
    F_RDONLY_PROG the verifier then takes its values as constants."""
    try:
        _bpf(MAP_FREEZE, _MapElem(m.fd, 0, 0, 0, 0))
    except OSError as e:
        raise UstackError(f"cannot freeze a BPF map: {e.strerror}")


def attach(perf_fd: int, prog_fd: int) -> None:
    """Run the program at each hit of a perf event (PERF_EVENT_IOC_SET_BPF)."""
    try:
        fcntl.ioctl(perf_fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
    except OSError as e:
        raise UstackError(f"cannot attach a BPF program to a perf event: {e.strerror}")


RAW_TRACEPOINT_OPEN = 17


class _RawTracepointOpen(ctypes.Structure):
    _fields_ = [("name", ctypes.c_uint64), ("prog_fd", ctypes.c_uint32)]


def attach_raw_tracepoint(name: str, prog_fd: int) -> int:
    """Run a PROG_RAW_TRACEPOINT program at every hit of kernel tracepoint
    `name` (e.g. "task_newtask"); returns the link's fd. Closing it detaches
    at once, where closing a perf event on a trace event waits for RCU
    grace periods (~75 ms each on this kernel, one per trace event)."""
    name_buf = ctypes.create_string_buffer(name.encode())
    try:
        return _bpf(RAW_TRACEPOINT_OPEN,
                    _RawTracepointOpen(ctypes.addressof(name_buf), prog_fd))
    except OSError as e:
        raise UstackError(f"cannot attach a BPF program to tracepoint {name}: "
                          f"{e.strerror}")


LINK_CREATE = 28
TRACE_UPROBE_MULTI = 48           # bpf_attach_type: many uprobes, one link
GET_ATTACH_COOKIE = 174           # the u64 a link gave the probe that fired


class _UprobeMultiLink(ctypes.Structure):
    _fields_ = [("prog_fd", ctypes.c_uint32), ("target_fd", ctypes.c_uint32),
                ("attach_type", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("path", ctypes.c_uint64), ("offsets", ctypes.c_uint64),
                ("ref_ctr_offsets", ctypes.c_uint64), ("cookies", ctypes.c_uint64),
                ("cnt", ctypes.c_uint32), ("multi_flags", ctypes.c_uint32),
                ("pid", ctypes.c_uint32), ("pad", ctypes.c_uint32)]


UPROBE_MULTI_RETURN = 1           # the link's uprobes are uretprobes


def attach_uprobe_multi(prog_fd: int, path: str, offsets: list, cookies: list,
                        pid: int = 0, returns: bool = False) -> int:
    """One link (its fd) putting a uprobe at each file offset of `path`, the
    program learning which fired from its cookie (GET_ATTACH_COOKIE); pid:
    only that process's threads (0: every process); `returns`: uretprobes. Closing the link takes
    every uprobe away after ONE wait for RCU grace periods, where closing a
    perf event per uprobe waits ~0.1 s for each (Linux 6.6+)."""
    path_buf = ctypes.create_string_buffer(os.fsencode(path))
    offs = (ctypes.c_uint64 * len(offsets))(*offsets)
    cooks = (ctypes.c_uint64 * len(cookies))(*cookies)
    attr = _UprobeMultiLink(prog_fd, 0, TRACE_UPROBE_MULTI, 0, ctypes.addressof(path_buf),
                            ctypes.addressof(offs), 0, ctypes.addressof(cooks),
                            len(offsets), UPROBE_MULTI_RETURN if returns else 0, pid, 0)
    return _bpf(LINK_CREATE, attr)


# --- BPF ring buffers --------------------------------------------------------------

MAP_RINGBUF = 27
RINGBUF_OUTPUT = 130              # (ringbuf, data, size, flags)
KTIME_GET_NS = 5                  # CLOCK_MONOTONIC, as perf stamps samples
GET_SMP_PROCESSOR_ID = 8
_RB_BUSY, _RB_DISCARD = 1 << 31, 1 << 30
_RB_HDR = 8
# A record in what RingBuf.read returns: its length, 4 bytes the reader
# skips, the record, padding to 8 bytes; the next record follows at
# ring_next(offset, length).
RING_RECORD_HEADER = _RB_HDR


def ring_next(offset: int, length: int) -> int:
    """Where the record after the one at `offset` (of `length` bytes) starts."""
    return offset + ((length + _RB_HDR + 7) & ~7)


class RingBuf:
    """A BPF_MAP_TYPE_RINGBUF and its consumer side, mmap'd: records a
    program wrote with bpf_ringbuf_output, read in order (one buffer for
    all CPUs). `size`: bytes, a power of two and a multiple of the page."""

    def __init__(self, size: int, name: str = "ustack_ring"):
        import mmap
        self.map = Map(MAP_RINGBUF, 0, 0, size, name)
        self.fd, self.size = self.map.fd, size
        page = mmap.PAGESIZE
        try:
            self._cons = mmap.mmap(self.fd, page, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
            # the data pages are mapped twice in a row: a record never wraps
            self._prod = mmap.mmap(self.fd, page + 2 * size, mmap.MAP_SHARED,
                                   mmap.PROT_READ, offset=page)
        except OSError as e:
            self.map.close()
            raise UstackError(f"cannot map a BPF ring buffer: {e.strerror}")
        self._page = page
        self._consumed = SharedWord(self._cons, 0)
        self._produced = SharedWord(self._prod, 0)
        self._hdr = struct.Struct("<II")
        self._end: int | None = None    # freeze(): read no further than this

    def freeze(self) -> None:
        """Read only what was written until now: the programs feeding the
        ring keep running after their perf events are disabled (a program
        on a trace event runs whatever the event's state), so a busy target
        would otherwise keep the last read from ever ending. The first
        call holds (a run's time up, then its reading of the rest)."""
        if self._end is None:
            self._end = self._produced.load()

    def read(self, most: int = 1 << 62) -> bytes:
        """The records written since the last read, as the ring lays them
        out (see RING_RECORD: a u32 length, 4 bytes, the record, padding
        to 8), end to end; b"" when there are none. Discarded records are
        left out. At about `most` bytes the rest is left for the next read.
        Only the headers are read one by one; the records are copied in
        one slice per run of them (a busy ring holds ~10^5)."""
        cons = self._consumed.load()
        prod = self._produced.load()        # acquire: x86 keeps order
        if self._end is not None:
            prod = min(prod, self._end)
        if cons >= prod:
            return b""
        mask, base = self.size - 1, self._page
        data, header = self._prod, self._hdr.unpack_from
        # the data pages are mapped twice: a run never wraps within `size`
        stop = min(prod, cons + min(most, self.size))
        parts: list = []
        run = at = cons
        while at < stop:
            length = header(data, base + (at & mask))[0]
            if length & _RB_BUSY:
                break                        # still being written
            nxt = at + (((length & ~_RB_DISCARD) + _RB_HDR + 7) & ~7)
            if length & _RB_DISCARD:
                if at > run:
                    parts.append(data[base + (run & mask):base + (run & mask) + at - run])
                run = nxt
            at = nxt
        if at > run:
            parts.append(data[base + (run & mask):base + (run & mask) + at - run])
        self._consumed.store(at)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def unmap(self) -> None:
        """Drop this process's mappings of the ring (nothing is read after):
        a process forked later copies none of their ~8,200 page table
        entries."""
        for word in (getattr(self, "_consumed", None), getattr(self, "_produced", None)):
            if word is not None:
                word.release()
        for m in (getattr(self, "_cons", None), getattr(self, "_prod", None)):
            if m is not None:
                m.close()

    def close(self) -> None:
        self.unmap()
        self.map.close()


def kernel_at_least(major: int, minor: int, release: str = "") -> bool:
    """Whether this kernel (or `release`, as uname -r says it) is Linux
    major.minor or later: for features whose absence costs more to ask the
    kernel about than to know."""
    try:
        have = tuple(int(x) for x in (release or os.uname().release).split(".")[:2])
    except ValueError:
        return False
    return have >= (major, minor)
