"""funccount's capture: calls per function counted in the kernel, through
one uprobe_multi link per binary instead of a perf event per uprobe.

Why: closing a perf event on a uprobe waits for RCU grace periods (~0.1 s
each, serialized by the kernel's event_mutex), so a glob of 86 functions
took 9 s to end; a link takes all its uprobes away after one wait. The
program learns which function fired from the link's cookie (its index in
the run's probes).

Scope as bcc's funccount and bpftrace's uprobes: -p/-c count the calls of
that process (its threads, across its exec), not of the children it
forks; a system-wide run counts every process but ustack itself."""
from __future__ import annotations

import os
import time
from collections import defaultdict

from ..kernel import bpf
from ..kernel.bpf import (JEQ, RSH, Asm, alu_imm, atomic_add, call, exit_, jmp_imm,
                          mov, mov_imm, stx)
from ..model import Losses, UstackError
from .bpf import ExecArming, lookup, read_calls, unless_armed

_KEY_AT = -8                          # the stack slot of the count map's key


def cookie_count_program(counts: bpf.Map, armed=None, skip_tgid: int = 0) -> bytes:
    """counts[cookie] += 1, cookie = the probe's index; not before the
    held command's exec (armed), never for process skip_tgid (ustack)."""
    a = Asm()
    a.emit(mov(6, 1))                               # ctx, for the cookie
    if armed is not None:
        unless_armed(a, armed)
    if skip_tgid:
        a.emit(call(bpf.GET_CURRENT_PID_TGID), alu_imm(RSH, 0, 32))
        a.jump(jmp_imm, JEQ, 0, skip_tgid, to="out")
    a.emit(mov(1, 6), call(bpf.GET_ATTACH_COOKIE), stx(10, _KEY_AT, 0, size=4))
    lookup(a, counts, _KEY_AT)
    a.jump(jmp_imm, JEQ, 0, 0, to="out")
    a.emit(mov_imm(1, 1), atomic_add(0, 0, 1))
    a.label("out")
    a.emit(mov_imm(0, 0), exit_())
    return a.assemble()


class FuncCountCapture:
    """The capture interface (see capture/perf.py) with nothing to stream:
    the counts are read with calls()."""
    unwind_note = ""
    buffer_pages = 0

    def __init__(self, probes: list, target):
        self.probes = probes
        self.target = target
        self.maps: list = []
        self.fds: list = []               # links, then programs
        self.counts = None
        self.arming = None                # ExecArming of a -c command

    def _map(self, *args) -> bpf.Map:
        m = bpf.Map(*args)
        self.maps.append(m)
        return m

    def open(self) -> None:
        try:
            self.counts = self._map(bpf.MAP_ARRAY, 4, 8, max(1, len(self.probes)),
                                         "ustack_calls")
            scope = self.target.scope
            if scope == "command":
                self.arming = ExecArming(self.target.pid)
            prog = bpf.load_program(
                bpf.PROG_KPROBE,
                cookie_count_program(self.counts, self.arming and self.arming.map,
                                     os.getpid() if scope == "system" else 0),
                "ustack_calls", attach_type=bpf.TRACE_UPROBE_MULTI)
            self.fds.append(prog)
            # -p 1,2,3: a link per process (each costs one wait at close)
            pids = (self.target.pid,) if scope != "system" else self.target.pids or (0,)
            sites: dict = defaultdict(list)       # path -> [(file offset, index)]
            for index, probe in enumerate(self.probes):
                sites[probe.path].append((probe.file_offset, index))
            for path, where in sites.items():
                for pid in pids:
                    try:
                        link = bpf.attach_uprobe_multi(
                            prog, path, [o for o, _i in where], [i for _o, i in where], pid)
                    except OSError as e:
                        raise UstackError(f"cannot put {len(where)} uprobe(s) on {path}: "
                                          f"{e.strerror}")
                    self.fds.insert(0, link)
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        if self.target.scope == "command":
            self.target.release()

    def read_chunks(self, timeout_ms: int) -> list:
        time.sleep(timeout_ms / 1000)    # nothing streams: the drain thread idles
        return []

    def decode(self, chunk, metas: list, samples: list, offset: int, limit: int) -> int:
        return len(chunk)

    def stop(self) -> None:
        pass

    def flush_lost(self) -> None:
        pass

    def losses(self) -> Losses:
        return Losses()

    def calls(self, reset: bool = False) -> list:
        """Calls per probe, in probe order."""
        return read_calls(self.counts, len(self.probes), reset)

    def close(self) -> None:
        for fd in self.fds:               # links first: nothing runs the programs
            os.close(fd)
        self.fds.clear()
        if self.arming is not None:
            self.arming.close()
            self.arming = None
        for m in self.maps:
            m.close()
        self.maps.clear()



def uprobe_multi_supported(release: str = "") -> bool:
    """Whether this kernel makes uprobe_multi links: Linux 6.6 and later
    (asking the kernel itself would cost a link, and closing one waits)."""
    return bpf.kernel_at_least(6, 6, release)
