"""The runtimes' passes of the in-kernel walks, loaded when the run meets
their runtime (bpf/passes.h's pass_* programs, in the unwinder's object and
in offcpu's, latency's and memleak's, each ending the event as its own
walk's program does).

The walk's program (unwind_count, unwind_trace, offcpu_switch, ...) goes on in the pass of
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
the walk that tail-call into it: one array per kind of probe program.
`loader` (below) gives a counter (BpfCounter's) of offcpu, latency or
memleak the passes of its own object."""
from __future__ import annotations

import threading
from collections.abc import Callable

from ..kernel import bpf_syscall
from ..model import UstackError
from .bpf_common import prog_type_of, unwind_object
from .fork_safe_lock import ForkSafeLock

# a runtime's pass programs in the unwinder's object (a Python stack that
# is deferred has its own)
PASS_PROGRAMS = {"v8": ("pass_v8",), "perl": ("pass_perl",), "ruby": ("pass_ruby",),
                 "python": ("pass_python", "pass_python_deferred"), "php": ("pass_php",)}
# the same in offcpu's, latency's and memleak's (their deferred stacks go
# to user space before the passes)
MODE_PASS_PROGRAMS = {runtime: (f"pass_{runtime}",) for runtime in PASS_PROGRAMS}

# (program name, PASSES array, a probe of the kind, by_cookie) -> the loaded
# program's fd, kept in the run's RunObjects (closed with the run)
PassLoader = Callable[[str, bpf_syscall.Map, object, bool], int]


class RuntimePasses:
    """The run's PASSES arrays, one per kind of walk program, and the
    runtimes whose passes are in them. `load` loads a pass program for a
    kind of probe; `owned` (run_objects.RunObjects) closes what is made."""

    def __init__(self, owned, load: PassLoader, programs: dict = PASS_PROGRAMS):
        self.owned = owned
        self._load = load
        self.programs = programs           # runtime -> its pass programs in load's object
        self._lock = ForkSafeLock()        # the rows loader's thread and the run's
        self._arrays: dict = {}            # (program type, by_cookie, kind) -> (PASSES, a probe)
        self.met: list = []                # runtimes met, in order: their passes loaded
        self.failed: dict = {}             # runtime -> why its pass did not load
        self.loaded = 0                    # pass programs loaded
        self._waiting: list = []           # (runtimes, then): see after()
        self._worker = None                # the thread that loads them

    def array_for(self, probe, by_cookie: bool = False, kind: str = "") -> bpf_syscall.Map:
        """The PASSES array of the walk programs of `probe`'s kind, made
        with the passes of the runtimes met so far; `kind`: where one
        object's programs for probes of one type end their events apart
        (offcpu's sched_switch and sched_waking)."""
        key = (prog_type_of(probe), by_cookie, kind)
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
        for program in self.programs[runtime]:
            try:
                fd = self._load(program, array, probe, key[1])
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


def runtimes_of(counter) -> bool:
    """Whether `counter` merges any runtime's frames."""
    return any(getattr(counter, runtime, None) is not None
               for runtime in ("python", "v8", "php", "perl", "ruby"))


def mode_passes(counter, load: PassLoader) -> RuntimePasses | None:
    """The RuntimePasses of a counter that walks stacks in a program of
    its own (offcpu, latency, memleak) and merges runtimes' frames, else
    None; its objects' entries wait for them as the unwinder's do."""
    if not runtimes_of(counter):
        return None
    passes = counter.objects.passes = RuntimePasses(counter.owned, load, MODE_PASS_PROGRAMS)
    return passes


def runtime_maps(counter) -> dict:
    """The maps of the runtimes `counter` merges, by the names the pass
    programs use."""
    named: dict = {}
    for runtime in ("python", "v8", "php", "perl", "ruby"):
        found = getattr(counter, runtime, None)
        if found is not None:
            named.update(found.maps.named())
    return named
