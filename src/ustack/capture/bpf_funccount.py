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
from ..model import Losses, UstackError
from .bpf_counter import ExecArming, bpf_program_object, read_calls


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

    def open(self) -> None:
        try:
            obj = bpf_program_object("funccount")
            self.counts = obj.make_map("calls", max(1, len(self.probes)))
            self.maps.append(self.counts)
            scope = self.target.scope
            if scope == "command":
                self.arming = ExecArming(self.target.pid)
            # funccount.bpf.c's count_by_cookie: calls[cookie] += 1
            maps = {"calls": self.counts}
            if self.arming is not None:
                maps["armed"] = self.arming.map
            given = set(maps)
            try:
                prog = obj.load("count_by_cookie", maps, {
                    "wait_for_exec": self.arming is not None,
                    "skip_tgid": os.getpid() if scope == "system" else 0},
                    name="ustack_calls")
            finally:                      # made for the load: (no -c) an unused `armed`
                self.maps.extend(m for name, m in maps.items() if name not in given)
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
