"""What the interpreter passes' user-space halves share (bpf_python,
bpf_v8, bpf_php, bpf_perl, bpf_ruby).

Each pass has maps made together from the unwinder object, written under
one lock (a ForkSafeLock: a forked closer finds it free), and an objects
map the kernel reads: one slot per interpreter object, written as the
run's objects load (unwind_objects.UnwindObjects asks `slot_of` of each).
The passes whose kernel half copies what user space names later (JS
functions, PHP names, Perl subs, Ruby iseqs) take those out every
`harvest_every` seconds (a tenth) while the maps are open. Each pass says only what
differs: how an object is recognised, how its facts are packed, what a
harvest does with what it took."""
from __future__ import annotations

import struct
import threading
import time

from ..kernel import bpf_syscall
from .bpf_common import unwind_object
from .fork_safe_lock import ForkSafeLock

_SLOT = struct.Struct("<I")


class InterpreterMaps(bpf_syscall.MapSet):
    """A pass's maps, each an attribute by its name, shared by the run's
    unwinder programs; `lock` is held by whoever writes them, and by
    close(). `before_close`: called once as they close (a last harvest).
    Made at their first use (an attribute, named()): a run that meets no
    object of the runtime makes none (the five passes' maps took ~7 ms of
    CPU, ~25 ms of wall, of a one-hit trace). `all` is empty until then,
    and again once closed (`closed`)."""

    def __init__(self, sizes: tuple):
        """`sizes`: (map name, max entries or None for the object's own)."""
        super().__init__()
        self.lock = ForkSafeLock()
        self.before_close = None
        self.closed = False
        self._sizes = tuple(sizes)
        self._names = tuple(name for name, _size in sizes)
        self._making = ForkSafeLock()       # not `lock`: slot_of holds it at first use

    def __getattr__(self, name: str):
        """A map by its name, the maps made now if they are not yet."""
        if name.startswith("_") or name not in self._names:
            raise AttributeError(name)
        self._make()
        return self.__dict__[name]

    def _make(self) -> None:
        with self._making:
            if self._names[0] in self.__dict__:
                return
            if self.closed:
                raise OSError("the run's maps are closed")
            obj = unwind_object()
            try:
                for name, size in self._sizes:
                    m = obj.make_map(name, size)
                    self.all.append(m)
                    self.__dict__[name] = m
            except BaseException:
                super().close()
                raise

    def named(self) -> dict:
        return {name: getattr(self, name) for name in self._names}

    def close(self) -> None:
        last, self.before_close = self.before_close, None
        if last is not None and self.all:
            try:
                last()
            except OSError:
                pass
        with self.lock:
            self.closed = True
            super().close()


class InterpreterObjects:
    """A pass's interpreter objects, in its objects map (`objects_map`,
    the maps' attribute), and the thread that harvests what the kernel
    copied every `harvest_every` seconds. A pass defines detect(path) (its
    facts, or None when the object is none of its), pack(facts) (the
    map's value) and, when it harvests, harvest() and wants_harvest()."""

    objects_map = ""                # the name of the maps' objects map
    harvester_name = ""             # the harvest thread's name
    harvest_every = 0.1             # seconds between two harvests

    def __init__(self, maps: InterpreterMaps):
        self.maps = maps
        self.slot_paths: list = []      # the objects map's slots: their paths
        self._harvester = None

    @staticmethod
    def detect(path: str):
        raise NotImplementedError

    @staticmethod
    def pack(facts) -> bytes:
        raise NotImplementedError

    def slot_of(self, path: str) -> int:
        """1 + the slot in the objects map of the interpreter object at
        `path` (a host path), written now; 0 when it is none (or no slot
        is left: its frames stay as walked)."""
        facts = self.detect(path)
        if facts is None:
            return 0
        with self.maps.lock:
            slot = len(self.slot_paths)
            try:    # the maps are made at the runtime's first object
                table = getattr(self.maps, self.objects_map)
                if not self.maps.all or slot >= table.max_entries:
                    return 0
                table.update(_SLOT.pack(slot), self.pack(facts))
            except OSError:
                return 0
            self.slot_paths.append(path)
        self.start_harvest()
        return slot + 1

    def harvest(self) -> int:
        """Take what the kernel copied since last time; how many."""
        return 0

    def wants_harvest(self) -> bool:
        """Whether a harvest thread is worth starting now."""
        return False

    def _harvest_while_open(self) -> None:
        while self.maps.all:
            self.harvest()
            time.sleep(self.harvest_every)

    def start_harvest(self) -> None:
        """Harvest every `harvest_every` seconds while the maps are open
        (once a run: later calls do nothing)."""
        if self._harvester is None and self.wants_harvest():
            self._harvester = threading.Thread(target=self._harvest_while_open, daemon=True,
                                               name=self.harvester_name)
            self._harvester.start()
