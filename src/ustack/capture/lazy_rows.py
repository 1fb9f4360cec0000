"""Unwind rows loaded while the run goes on: the probes attach first, and
a thread builds and loads the rows of the objects the in-kernel walk
found without them, most wanted first (whole-machine runs), or of the
objects a -p/-c target maps whose rows the cache does not hold yet (their
building took clang++'s run 13-31 s before its first sample: libLLVM's
and libclang-cpp's ~1 M rows each), smallest first.

The walk counts, per object it met without rows, how often (the WANTED
map of bpf/unwind.h); the stacks it could not finish go to user space as
deferred records (capture/bpf_unwind.py), as for a program started during
the run. So only objects that were sampled are ever built, and the
cache (objfile/cache.py) makes them instant in the next run.

The walk knows an object by (dev, inode); its path comes from the
processes' maps (ObjectPaths), read when the loader starts, again when a
wanted object is not among them, and as MMAP2 records announce new ones.

It starts on the objects the caller gives (`first`: those every stack of
a Python, Ruby, PHP or Perl running at the start goes through,
bpf_unwind.interpreters_objects)
while the run's programs load and attach: the walk meets a process's
objects one at a time, so without them a busy Python's first ~50 ms of
samples went to user space. Those whose rows the cache holds load first
and the run's start waits for them (wait_first): loaded after it, on a
loaded machine they took 0.2-0.5 s, and a running Ruby's samples of that
time (14-16 of a whole-machine run's 40-46) went to user space as
copies, whose Ruby frames are read from the live process moments later:
under load such reads often no longer fit the sample (C frames kept) or
are of a moment later. Rows the cache does not hold are built after the
start: a cold cache's builds do not hold up the start."""
from __future__ import annotations

import threading
import time

from ..kernel import procfs
from ..model import Mapping, UstackError
from ..objfile.mapped import object_path
from .unwind_objects import UnwindObjects, object_keys

POLL_S = 0.05                   # how often the loader looks at WANTED when idle
FIRST_WAIT_S = 3.0              # the start waits this long at most for the cached first rows


class ObjectPaths:
    """(dev, inode) -> host path of the objects the processes map
    (`pids()`: those processes; every one by default)."""

    def __init__(self, pids=procfs.pids):
        self.pids = pids
        self.paths: dict = {}
        self._seen: set = set()         # paths already stat()ed

    def note(self, path: str) -> None:
        if path in self._seen:
            return
        self._seen.add(path)
        for key in object_keys(path):
            self.paths.setdefault(key, path)

    def note_mapping(self, mapping, pid: int) -> None:
        """The object of a mapping an MMAP2 record announced."""
        if mapping.path.startswith("/") and not mapping.host_path:
            path = procfs.host_path(pid, mapping.path, mapping.start, mapping.end)
            mapping = Mapping(mapping.start, mapping.end, mapping.pgoff, mapping.path, path)
        path = object_path(mapping)
        if path is not None:
            self.note(path)

    def scan(self) -> dict:
        """Every object the processes map now; pid -> the paths of its
        objects, in the order of its maps (one read of every process's
        maps serves bpf_unwind.interpreters_objects too)."""
        by_pid: dict = {}
        for pid in self.pids():
            paths = by_pid[pid] = []
            for m in procfs.executable_mappings(pid):
                path = object_path(m)
                if path is not None:
                    self.note(path)
                    paths.append(path)
        return by_pid


class LazyRows:
    """The loader: a thread that loads the rows of the objects WANTED
    names, the most wanted first, and those that did not fit once room can
    be made (UnwindObjects.retry_full), until stop(). `loaded`: how many
    objects it loaded; `unknown`: wanted objects no process map named;
    `keeper`: see end_notes in bpf_capture.py."""

    def __init__(self, objects: UnwindObjects, paths: ObjectPaths | None = None,
                 first: list = (), keeper: bool = False):
        self.objects = objects
        # started only to bring back the rows evicted or not fitting of a
        # run that loads the rest itself (-p, -c): its work is churn_note's
        self.keeper = keeper
        self.first = list(first)
        self.paths = paths or ObjectPaths()
        self.loaded = 0
        self.pending = 0                # wanted but not loaded when the run ended
        self.unknown: set = set()
        self._stop = threading.Event()
        self._first_cached = threading.Event()     # the cached rows of `first` are loaded
        self._thread = threading.Thread(target=self._run, name="ustack-rows", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wait_first(self, interrupt) -> None:
        """Until the rows of `first` that the cache holds are loaded (or
        FIRST_WAIT_S passed: a machine too loaded for them starts without),
        ending at once when the run is asked to end (`interrupt`)."""
        deadline = time.monotonic() + FIRST_WAIT_S
        while not self._first_cached.wait(0.05):
            interrupt.check()
            if time.monotonic() >= deadline:
                return

    def note_mapping(self, mapping, pid: int) -> None:
        """From the reader's thread: ObjectPaths' dict and set updates
        are each atomic, and a path noted twice is only stat()ed twice."""
        self.paths.note_mapping(mapping, pid)

    def stop(self) -> None:
        """No more loading (an object under way is left unloaded: the run's
        maps may close while it builds, and its samples are deferred)."""
        if not self._stop.is_set():
            self._stop.set()
            self.pending = len(self.objects.wanted()) or sum(
                1 for path in self.first if object_keys(path)[:1] and
                object_keys(path)[0] not in self.objects.loaded)

    def _run(self) -> None:
        try:
            to_build = [path for path in self.first if not self._add(path, cached_only=True)]
            self._first_cached.set()
            for path in to_build:
                self._add(path)
            if self._stop.is_set():
                return
            self.paths.scan()
            while not self._stop.is_set():
                # objects whose rows did not fit, being sampled: loaded
                # once idle ones can make room (unwind_objects.UnwindObjects)
                self.objects.tick()
                self.objects.retry_full()
                if not self.load_next():
                    self._stop.wait(POLL_S)
        except (OSError, UstackError):
            pass                        # the run ended under the loader
        finally:
            self._first_cached.set()

    def _add(self, path: str, cached_only: bool = False) -> bool:
        """Load the rows of `path` (False: cached_only, and the cache does
        not hold them)."""
        if self._stop.is_set():
            return True
        before = len(self.objects.loaded)
        added = self.objects.add_path(path, run_waits=False, cached_only=cached_only)
        self.loaded += len(self.objects.loaded) > before
        return added

    def load_next(self) -> bool:
        """Load the most wanted object not loaded yet; False if none."""
        hits = self.objects.wanted()
        todo = [k for k in sorted(hits, key=hits.get, reverse=True) if k not in self.unknown]
        if not todo:
            return False
        key = todo[0]
        path = self.paths.paths.get(key)
        if path is None:                   # mapped since the last look
            self.paths.scan()
            path = self.paths.paths.get(key)
        if path is None:
            self.unknown.add(key)
            return True
        if self._stop.is_set():
            return False
        self.objects.add_path(path, key, run_waits=False)
        if key in self.objects.loaded:
            self.loaded += 1
        return True
