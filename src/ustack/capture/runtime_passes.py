"""The runtimes' passes of the in-kernel unwinder, loaded when the run
meets their runtime (bpf/unwind.bpf.c's pass_* programs).

The walk's program (unwind_count, unwind_trace) goes on in the pass of
each runtime whose object it met (V8, Perl, Ruby, Python, PHP) by a tail
call through PASSES, a program array; the last pass ends the event as the
walk's program would. A pass is loaded (verified) only when the run first
meets an object of its runtime (UnwindObjects asks `need` before it writes
that object's entry, which is what makes a walk go on in the pass): a run
that meets no interpreter, a one-hit trace of `echo`, verifies none of the
~30 ms the five cost in every program that held them. A pass that fails
to load leaves its slot empty: the stacks through its runtime end with
the note of PASS_MISSING, their native frames whole.

Loading a pass takes the verifier tens of ms (more on a busy machine),
so it is done in a thread of its own (`after`): the object's rows are
loaded meanwhile, its entry written only once the passes it needs are in
(until then its stacks are deferred to user space, as before its rows
were loaded), and the run's reader goes on reading: the live reads of a
deferred sample's Python frames stay close to the sample.

A program array takes programs of one type and attach type, as those of
the walk that tail-call into it: one array per kind of probe program."""
from __future__ import annotations

import threading
from collections.abc import Callable

from ..kernel import bpf_syscall
from ..model import UstackError
from .bpf_common import prog_type_of, unwind_object
from .fork_safe_lock import ForkSafeLock

# a runtime's pass programs (a Python stack that is deferred has its own)
PASS_PROGRAMS = {"v8": ("pass_v8",), "perl": ("pass_perl",), "ruby": ("pass_ruby",),
                 "python": ("pass_python", "pass_python_deferred"), "php": ("pass_php",)}

# (program name, PASSES array, a probe of the kind, by_cookie) -> the loaded program's fd
PassLoader = Callable[[str, bpf_syscall.Map, object, bool], int]


class RuntimePasses:
    """The run's PASSES arrays, one per kind of walk program, and the
    runtimes whose passes are in them. `load` loads a pass program for a
    kind of probe; `owned` (run_objects.RunObjects) closes what is made."""

    def __init__(self, owned, load: PassLoader):
        self.owned = owned
        self._load = load
        self._lock = ForkSafeLock()        # the rows loader's thread and the run's
        self._arrays: dict = {}            # (program type, by_cookie) -> (PASSES, a probe)
        self.met: list = []                # runtimes met, in order: their passes loaded
        self.failed: dict = {}             # runtime -> why its pass did not load
        self.loaded = 0                    # pass programs loaded
        self._waiting: list = []           # (runtimes, then): see after()
        self._worker = None                # the thread that loads them

    def array_for(self, probe, by_cookie: bool = False) -> bpf_syscall.Map:
        """The PASSES array of the walk programs of `probe`'s kind, made
        with the passes of the runtimes met so far."""
        key = (prog_type_of(probe), by_cookie)
        with self._lock:
            if key not in self._arrays:
                array = self.owned.map(unwind_object().make_map("passes"))
                self._arrays[key] = (array, probe)
                for runtime in self.met:
                    self._fill(key, runtime)
            return self._arrays[key][0]

    def need(self, runtime: str) -> None:
        """Load the passes of `runtime` ("python", "v8", "php", "perl",
        "ruby") into every array, once a run; before a walk can meet it."""
        with self._lock:
            if runtime in self.met:
                return
            self.met.append(runtime)
            for key in self._arrays:
                self._fill(key, runtime)

    def _fill(self, key: tuple, runtime: str) -> None:
        array, probe = self._arrays[key]
        slots = unwind_object().enum("pass_slot")
        for program in PASS_PROGRAMS[runtime]:
            try:
                fd = self.owned.program(self._load(program, array, probe, key[1]))
            except UstackError as e:       # its stacks say so (PASS_MISSING)
                self.failed[runtime] = str(e)
                continue
            array.update(slots[program.upper()].to_bytes(4, "little"), fd.to_bytes(4, "little"))
            self.loaded += 1

    def after(self, runtimes: list, then: Callable[[], None] | None = None) -> bool:
        """False when the passes of `runtimes` are loaded already (the
        caller goes on), else True: they are loaded by a thread of their
        own, which calls `then()` once they are."""
        with self._lock:
            if all(runtime in self.met for runtime in runtimes):
                return False
            self._waiting.append((runtimes, then))
            if self._worker is None:
                self._worker = threading.Thread(target=self._load_waiting, daemon=True,
                                                name="ustack-passes")
                self._worker.start()
            return True

    def _load_waiting(self) -> None:
        while True:
            with self._lock:
                if not self._waiting:
                    self._worker = None
                    return
                runtimes, then = self._waiting.pop(0)
            try:
                for runtime in runtimes:
                    self.need(runtime)
                if then is not None:
                    then()
            except (OSError, UstackError):  # the run closed its maps meanwhile
                pass

    def settle(self) -> None:
        """Wait until the passes asked for by after() are loaded."""
        with self._lock:
            worker = self._worker
        if worker is not None:
            worker.join()
