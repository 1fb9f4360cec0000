"""The objects that processes running at a whole-machine run's start have
mapped (or the process a -p run traces): where its first samples land. The functions of the big ones
(node's: ~1.2 s of Python) start building in children at once, from a
thread, while the run loads its programs; else the first sample in node
started that child and the run waited for it, ~1.5 s, at its end."""
from __future__ import annotations

import os
import threading

from ..kernel import procfs
from ..model import UstackError
from ..objfile import function_builder

MOST_EARLY_BUILDS = 4           # objects built ahead of their first sample, the biggest


def mapped_by_running(skip: int, pids=None) -> list:
    """The files (as this process opens them) mapped executable by the
    processes running now (or by `pids`, running or not), but `skip`,
    biggest first; only those big enough to hold symbol tables worth a
    child."""
    sizes: dict = {}
    for pid in pids if pids is not None else procfs.pids():
        if pid == skip or (pids is None and not procfs.is_running(pid)):
            continue
        for m in procfs.executable_mappings(pid):
            path = m.open_path
            if path in sizes or not path.startswith("/"):
                continue
            try:
                sizes[path] = os.stat(path).st_size
            except OSError:
                continue
    return sorted((p for p, size in sizes.items()
                   if size >= function_builder.BIG_SYMBOL_TABLES),
                  key=sizes.__getitem__, reverse=True)


def start_building(skip: int, pids=None) -> threading.Thread:
    """Start, from a daemon thread, the children that build the functions
    of the running processes' (or `pids`') big objects (MOST_EARLY_BUILDS
    of them)."""
    def run() -> None:
        from ..objfile.elf import ElfImage
        started = 0
        try:
            for path in mapped_by_running(skip, pids):
                if started >= MOST_EARLY_BUILDS:
                    return
                try:
                    image = ElfImage.open(path)
                except UstackError:
                    continue
                started += function_builder.start(image) is not None
        except Exception:       # only a head start: the run builds what it asks for
            return

    thread = threading.Thread(target=run, name="ustack-early-builds", daemon=True)
    thread.start()
    return thread
