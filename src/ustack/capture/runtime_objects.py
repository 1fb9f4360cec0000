"""Each runtime's user-space half of its pass (bpf_python.PythonProcs,
bpf_v8.V8Objects, bpf_php.PhpObjects, bpf_perl.PerlObjects,
bpf_ruby.RubyObjects), made when the run first meets an object of the
runtime, as its pass programs are loaded then (runtime_passes.py).

Until then a stand-in answers the run's UnwindObjects (which asks
`slot_of` of every object whose rows load) by the file's name alone
(unwind/runtime_files.py): a run that maps no runtime's file, a one-hit
trace of `echo`, imports none of their modules (~20 of them) and makes
none of their objects. At the first file that may be the runtime's, its
module is imported, its objects made (they put themselves in the
UnwindObjects' place of the stand-in) and the counter's `on_runtime`
told, which wires them to the run's names tables (bpf_capture)."""
from __future__ import annotations

import importlib

from ..unwind.runtime_files import may_be
from .fork_safe_lock import ForkSafeLock

# runtime -> (its module in capture/, its maps, its objects; the counter's
# and the UnwindObjects' attribute that hold them)
RUNTIMES = {"python": ("bpf_python", "PythonMaps", "PythonProcs", "python", "interpreters"),
            "v8": ("bpf_v8", "V8Maps", "V8Objects", "v8", "v8"),
            "php": ("bpf_php", "PhpMaps", "PhpObjects", "php", "php"),
            "perl": ("bpf_perl", "PerlMaps", "PerlObjects", "perl", "perl"),
            "ruby": ("bpf_ruby", "RubyMaps", "RubyObjects", "ruby", "ruby")}


class NotMetYet:
    """The UnwindObjects' stand-in for a runtime the run has not met."""

    slot_paths = ()

    def __init__(self, made: "RuntimeObjects", runtime: str):
        self._made = made
        self.runtime = runtime

    def slot_of(self, path: str) -> int:
        if not may_be(self.runtime, path):
            return 0
        return self._made.make(self.runtime).slot_of(path)


class RuntimeObjects:
    """The runtimes a counter (bpf_unwind.UnwindCounter) merges frames of,
    made as met. `counter` has `owned` (its RunObjects), `objects` (its
    UnwindObjects) and `on_runtime` (called with a runtime's name once its
    objects are made, or None)."""

    def __init__(self, counter, runtimes: list):
        self.counter = counter
        self.wanted = tuple(runtimes)
        self._lock = ForkSafeLock()        # the rows loader's thread and the run's
        for runtime in self.wanted:
            setattr(counter.objects, RUNTIMES[runtime][4], NotMetYet(self, runtime))

    def make(self, runtime: str):
        """The runtime's objects, made now if they are not yet."""
        module_name, maps, objects, attribute, _in_objects = RUNTIMES[runtime]
        with self._lock:
            made = getattr(self.counter, attribute)
            if made is not None:
                return made
            module = importlib.import_module(f".{module_name}", __package__)
            made = getattr(module, objects)(self.counter.owned.map(getattr(module, maps)()),
                                            objects=self.counter.objects)
            setattr(self.counter, attribute, made)
            told = self.counter.on_runtime
        if told is not None:
            told(runtime)
        return made

    def make_all(self) -> None:
        """Every wanted runtime's objects, now (a program that holds their
        passes inline names their maps as it loads)."""
        for runtime in self.wanted:
            self.make(runtime)
