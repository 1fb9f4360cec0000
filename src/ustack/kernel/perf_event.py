"""perf_event_open(2) through ctypes: the attr struct, opening events, ioctls.

The layout follows include/uapi/linux/perf_event.h (PERF_ATTR_SIZE_VER8).
Flags are one u64 bitfield in the kernel; we compose it from named bits so
the struct needs no ctypes bitfields."""
from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import struct

from ..model import UstackError

NR_PERF_EVENT_OPEN = 298          # x86-64
PERF_FLAG_FD_CLOEXEC = 1 << 3

# perf_type_id
TYPE_HARDWARE, TYPE_SOFTWARE, TYPE_TRACEPOINT = 0, 1, 2
SW_CPU_CLOCK, SW_DUMMY = 0, 9

# perf_event_sample_format
SAMPLE_IP = 1 << 0
SAMPLE_TID = 1 << 1
SAMPLE_TIME = 1 << 2
SAMPLE_ADDR = 1 << 3
SAMPLE_READ = 1 << 4
SAMPLE_CALLCHAIN = 1 << 5
SAMPLE_ID = 1 << 6
SAMPLE_CPU = 1 << 7
SAMPLE_PERIOD = 1 << 8
SAMPLE_STREAM_ID = 1 << 9
SAMPLE_RAW = 1 << 10
SAMPLE_REGS_USER = 1 << 12
SAMPLE_STACK_USER = 1 << 13
SAMPLE_IDENTIFIER = 1 << 16

# perf_event_read_format
FORMAT_LOST = 1 << 4              # Linux 6.0+: records the event failed to write

# attr.flags bits, in the kernel's declaration order
FLAG_BITS = {
    "disabled": 0, "inherit": 1, "pinned": 2, "exclusive": 3,
    "exclude_user": 4, "exclude_kernel": 5, "exclude_hv": 6,
    "exclude_idle": 7, "mmap": 8, "comm": 9, "freq": 10,
    "inherit_stat": 11, "enable_on_exec": 12, "task": 13, "watermark": 14,
    "mmap_data": 17, "sample_id_all": 18, "exclude_host": 19,
    "exclude_guest": 20, "exclude_callchain_kernel": 21,
    "exclude_callchain_user": 22, "mmap2": 23, "comm_exec": 24,
    "use_clockid": 25, "context_switch": 26,
    "build_id": 34,               # MMAP2 carries the build-id (Linux 5.12+)
}

# ioctls (_IO('$', n) etc.)
IOC_DISABLE = 0x2401
IOC_SET_OUTPUT = 0x2405
IOC_ID = 0x80082407

# x86-64 perf_regs order (arch/x86/include/uapi/asm/perf_regs.h)
X86_REGS = ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp", "ip", "flags",
            "cs", "ss", "ds", "es", "fs", "gs",
            "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")


class PerfEventAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),   # or sample_freq when freq=1
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),   # or wakeup_watermark
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
        ("aux_sample_size", ctypes.c_uint32),
        ("reserved_3", ctypes.c_uint32),
        ("sig_data", ctypes.c_uint64),
        ("config3", ctypes.c_uint64),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


CLOCK_MONOTONIC = 1


def make_attr(type_: int, config: int = 0, *, sample_type: int = 0,
              period: int = 1, freq: int = 0, flags=(),
              regs_user: int = 0, stack_user: int = 0,
              wakeup_watermark: int = 0, max_stack: int = 0,
              read_format: int = 0, clock_monotonic: bool = False) -> PerfEventAttr:
    """`clock_monotonic`: times in CLOCK_MONOTONIC ns (what BPF's
    bpf_ktime_get_ns gives) instead of perf's own clock."""
    attr = PerfEventAttr()
    attr.type = type_
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = config
    attr.sample_period = freq if freq else period
    attr.sample_type = sample_type
    attr.read_format = read_format
    bits = 0
    for name in flags:
        bits |= 1 << FLAG_BITS[name]
    if freq:
        bits |= 1 << FLAG_BITS["freq"]
    if wakeup_watermark:
        bits |= 1 << FLAG_BITS["watermark"]
        attr.wakeup_events = wakeup_watermark
    if clock_monotonic:
        bits |= 1 << FLAG_BITS["use_clockid"]
        attr.clockid = CLOCK_MONOTONIC
    attr.flags = bits
    attr.sample_regs_user = regs_user
    attr.sample_stack_user = stack_user
    attr.sample_max_stack = max_stack
    return attr


def open_event(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int = -1,
               what: str = "event") -> int:
    """Open one event; turn the errno into a message a person can act on."""
    fd = _libc.syscall(NR_PERF_EVENT_OPEN, ctypes.byref(attr), pid, cpu,
                       group_fd, PERF_FLAG_FD_CLOEXEC)
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    raise PerfOpenError(err, pid, what)


class PerfOpenError(UstackError):
    def __init__(self, err: int, pid: int, what: str):
        self.errno = err
        self.pid = pid
        if err == errno.ESRCH:
            msg = f"no such process: {pid}"
        elif err in (errno.EACCES, errno.EPERM):
            msg = f"permission denied opening {what}: run ustack as root"
        elif err == errno.EMFILE:
            msg = (f"too many open files opening {what}: raise `ulimit -n` "
                   "or trace fewer events")
        else:
            msg = f"perf_event_open failed for {what}: {os.strerror(err)}"
        super().__init__(msg)


def event_id(fd: int) -> int:
    buf = bytearray(8)
    fcntl.ioctl(fd, IOC_ID, buf, True)
    return int.from_bytes(buf, "little")


def read_lost(fd: int) -> int:
    """How many records the event (with its inherited copies) could not
    write because its ring buffer was full: the kernel's own count, bumped
    in the same place as the PERF_RECORD_LOST total (needs FORMAT_LOST
    alone in read_format)."""
    buf = os.read(fd, 16)
    if len(buf) != 16:
        raise OSError(f"perf event read returned {len(buf)} bytes, not 16")
    return struct.unpack("<QQ", buf)[1]


def set_output(fd: int, target_fd: int) -> None:
    fcntl.ioctl(fd, IOC_SET_OUTPUT, target_fd)


def disable(fd: int) -> None:
    fcntl.ioctl(fd, IOC_DISABLE, 0)


MAX_SAMPLE_RATE = "/proc/sys/kernel/perf_event_max_sample_rate"


def max_sample_rate() -> int | None:
    """The highest sampling frequency the kernel takes (it lowers it on
    its own when sampling costs too much), None if it cannot be read."""
    try:
        with open(MAX_SAMPLE_RATE) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=None)
def max_stack() -> int:
    """kernel.perf_event_max_stack: the most frames a callchain (or a BPF
    stack) may have; read once, it fits attr.sample_max_stack (u16)."""
    try:
        with open("/proc/sys/kernel/perf_event_max_stack") as f:
            return min(int(f.read()), 0xFFFF)
    except (OSError, ValueError):
        return 127


def cpus_online() -> list:
    """CPU numbers from /sys/devices/system/cpu/online ("0-1,4")."""
    with open("/sys/devices/system/cpu/online") as f:
        text = f.read().strip()
    cpus = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus
