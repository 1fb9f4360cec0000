"""process_vm_readv(2) through ctypes: many ranges of another process's
memory in one system call, for reads made while its threads are stopped
(each syscall there is stopped time). Needs what ptrace attaching needs."""
from __future__ import annotations

import ctypes
import errno
import os

IOV_MAX = 1024                  # iovecs per call (UIO_MAXIOV)


class _Iovec(ctypes.Structure):
    _fields_ = (("base", ctypes.c_void_p), ("len", ctypes.c_size_t))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.process_vm_readv.argtypes = (ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong)
_libc.process_vm_readv.restype = ctypes.c_ssize_t


def read_ranges(pid: int, ranges: list) -> list:
    """The bytes of each (address, size) of `ranges`, read IOV_MAX ranges a
    call; a range the kernel could not read whole comes back short (the
    kernel stops at the first unreadable page, so the ranges after it in
    the call are read again on their own)."""
    out: list = []
    for first in range(0, len(ranges), IOV_MAX):
        out += _read_call(pid, ranges[first:first + IOV_MAX])
    return out


def _read_call(pid: int, ranges: list) -> list:
    n = len(ranges)
    if n == 0:
        return []
    buffers = [ctypes.create_string_buffer(max(size, 1)) for _addr, size in ranges]
    local = (_Iovec * n)(*((ctypes.cast(b, ctypes.c_void_p), size)
                           for b, (_addr, size) in zip(buffers, ranges)))
    remote = (_Iovec * n)(*((addr, size) for addr, size in ranges))
    got = _libc.process_vm_readv(pid, local, n, remote, n, 0)
    if got < 0:
        err = ctypes.get_errno()
        if err not in (errno.EFAULT, errno.EIO, errno.ENOMEM):
            raise OSError(err, os.strerror(err))
        got = 0                         # the first range is unreadable
    out: list = []
    for i, (buffer, (_addr, size)) in enumerate(zip(buffers, ranges)):
        if got >= size:
            out.append(buffer.raw[:size])
            got -= size
        elif n == 1 or got:             # this range's readable start
            out.append(buffer.raw[:got])
            return out + [_read_call(pid, [r])[0] for r in ranges[i + 1:]]
        else:                           # nothing of it in this call: alone
            return out + [_read_call(pid, [r])[0] for r in ranges[i:]]
    return out
