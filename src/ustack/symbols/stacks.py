"""RawSamples to symbolized Stacks: unwind (the unwind stage) and symbolize
each distinct raw stack once. A key says what tells raw stacks apart
(Unwinder.stack_key, within the process and exec generation that gives its
addresses meaning); stacks of the same key share one Stack object."""
from __future__ import annotations

from ..model import KERNEL_UNWIND_WHOLE, LOWEST_FRAME_TAG, Frame, RawSample, Stack
from ..target.mappings import PinnedView
from ..unwind.fp import callchain_addresses
from ..unwind.unwinder import Unwinder
from .normalize import unnamed_jit
from .symbolizer import SymbolOptions, Symbolizer

MAX_CACHED = 100_000               # distinct stacks kept; bounds memory
# A stack the walk ended, not a limit (a limit's cut says so in a note, but
# perf's frame-pointer chains stop at 127 frames without one): the symbols
# stage is told (most of a JVM's ending in its JIT code: no frame pointers)
WALK_ENDED_BELOW = 100
CUT_IN_ANONYMOUS = "stack cut at anonymous memory"     # unwind/unwinder.py's note
# Printed between the kernel frames and the user frames of a stack (bcc's
# separator); kernel frames come first: a stack reads innermost first.
SEPARATOR = Frame(addr=0, module="", function="--")
# What a stack without user frames shows: the idle task (pid 0) and kernel
# threads have no user stack (bcc and perf label them the same way).
IDLE = Frame(addr=0, module="", function="[idle]")
KERNEL_THREAD = Frame(addr=0, module="", function="[kernel]")
# What a stack of unnamed frames says when its process's maps were never
# seen (tracefs reads them from /proc: a process gone first stays unnamed)
NO_MAPS = ("no memory map of this process was seen: it exited before ustack "
           "could read it (--backend perf or bpf record every mapping)")
# A JVM's stack walked on frame pointers with no copy (ftrace's
# userstacktrace, --unwind fp): its compiled code keeps no frame pointer,
# and the Java walk needs the copy: its JIT frames are said, not silent
JAVA_NOT_WALKED = ("Java frames not walked: a JVM's compiled code keeps no frame pointer, and "
                   "this stack was walked on frame pointers with no copy to walk it by the "
                   "JVM's own tables")
# Where a frame-pointer walk ends on its own in a whole stack: the program's
# entry, a thread's start (libc, Go's runtime), the dynamic loader's entry.
# Ending anywhere else, it stopped at a caller that keeps no frame pointer.
ROOTS = frozenset((
    "_start", "__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl",
    "start_thread", "clone", "clone3", "__clone", "__clone3", "__clone_internal",
    "thread_start", "_dl_start", "_dl_start_user",
    "runtime.goexit", "runtime.rt0_go", "runtime.mstart", "runtime.mstart0",
    "runtime.mcall", "runtime.systemstack"))


def fp_cut_note(frames: tuple, advice: str) -> str | None:
    """The note of a frame-pointer stack that ends short of a root, or None."""
    last = frames[-1]
    if last.function and last.function.removesuffix(".abi0") in ROOTS:
        return None
    where = last.module or "[unknown]"
    return (f"stack cut at {where}: the frame-pointer walk ends there, short of the "
            f"program's entry (a caller keeps no frame pointer); {advice}")


class LiveReaders:
    """Called at each copied stack: gives the unwinder the readers of the
    runtimes whose names tables a capture made active since (V8's; Ruby's,
    PHP's and Perl's together), importing them then: a run that meets no
    runtime imports none."""

    def __init__(self, names):
        self.names = names
        self._scripts = (None, None, None)      # the script tables the readers were made for

    def __call__(self, unwinder) -> None:
        active = self.names.active
        v8 = active("js")
        if v8 is not None and unwinder.v8_live is None:
            from ..unwind.v8_live import V8Live
            unwinder.v8_live = V8Live(v8.remember)
        scripts = (active("ruby"), active("php"), active("perl"))
        if scripts != self._scripts:
            from ..unwind.script_readers import live_runtimes
            self._scripts = scripts
            if unwinder.script_live is not None:    # its processes let go
                unwinder.script_live.close()
            unwinder.script_live = live_runtimes(*scripts)


# a process that maps it runs a JVM: unwind/hotspot_runtime.LIBJVM, not
# imported (its imports are what a run of no JVM is spared)
LIBJVM = "libjvm.so"


class JvmWalkerFactory:
    """The unwinder's hotspot_factory: called with the pid of each copied
    stack until it gives the HotSpot walker (unwind/hotspot_live.py), made
    at the first that maps libjvm. A process found without one is looked
    at again once its maps changed (the `java` launcher maps libjvm soon)."""

    def __init__(self, tracker, names):
        self.tracker = tracker
        self.names = names
        self._no_jvm: dict = {}         # pid -> (exec generation, mappings) seen without libjvm

    def __call__(self, pid: int):
        maps = self.tracker.current_maps(pid)
        seen = (self.tracker.generations.get(pid, 0), len(maps))
        if self._no_jvm.get(pid) == seen:
            return None
        if not any(m.path.endswith("/" + LIBJVM) for m in maps):
            self._no_jvm[pid] = seen
            return None
        from ..unwind.hotspot_live import HotSpotLive
        java = self.names.get("java")
        java.active = True
        return HotSpotLive(java.remember)


class StackResolver:
    """`tracker` is the run's MappingTracker: mappings by pid and exec
    generation; `options` what the user asked of names; `cut_advice` what
    a stack cut by its copy's size advises (None: raise --stack-size);
    `python_code` the run's PythonCode (symbols/python.py), `v8_functions`
    its V8Functions (symbols/v8.py), `php_functions` its PhpFunctions
    (symbols/php.py), `perl_subs` its PerlSubs (symbols/perl.py),
    `ruby_iseqs` its RubyIseqs (symbols/ruby.py), or `names` all of them
    (symbols/runtime_names.py); `fp_advice`, given when the run walks
    frame pointers, what a stack that ends short of a root advises."""

    def __init__(self, tracker, options: SymbolOptions = SymbolOptions(),
                 cut_advice: str | None = None, python_code=None,
                 fp_advice: str | None = None, v8_functions=None, php_functions=None,
                 perl_subs=None, ruby_iseqs=None, names=None):
        self.tracker = tracker
        self.fp_advice = fp_advice
        self.java = options.java
        self.unwinder = Unwinder(options.debug_dirs, cut_advice)
        # one symbolizer (one cache) for the run, its view pinned to the
        # exec generation of the stack being named
        self._view = PinnedView(tracker)
        self.symbolizer = Symbolizer(self._view, options, python_code, v8_functions,
                                     php_functions, perl_subs, ruby_iseqs, names)
        names = self.symbolizer.names
        if tracker.live:
            # the kernel names JS frames and merges Ruby, PHP and Perl
            # frames in the stacks it walks: those it hands over unwalked get
            # theirs as they are unwound, by readers made at a copied stack
            # once the capture met their runtime
            self.unwinder.live_factory = LiveReaders(names)
        if options.java and tracker.live:
            # a JVM's stacks come copied (no CFI in its code cache): its Java
            # frames are walked and named as they are unwound, by a walker
            # made at the first copied stack of a process that maps libjvm (a
            # run of no JVM spares its imports: a Python profile's first
            # deferred stack made it, ~1.5 ms); a recording's are named by
            # what it kept (its process is gone)
            self.unwinder.hotspot_factory = JvmWalkerFactory(tracker, names)
        self._stacks: dict = {}         # key() -> (Stack, version of the JIT map naming it)

    def close(self) -> None:
        """The run is over: what the unwinder reads live processes through
        is closed (Unwinder.close)."""
        self.unwinder.close()

    @property
    def warnings(self) -> list:
        """Debug files refused by the symbolizer or the unwinder."""
        return (self.symbolizer.warnings + self.unwinder.warnings
                + python_warnings(self.symbolizer.names))

    def key(self, sample: RawSample) -> tuple:
        """(pid, exec generation, probe-independent stack key)."""
        pid = sample.pid
        tracker = self.tracker
        if sample.regs is None and sample.time_ns and type(sample) is RawSample:
            # a walked stack of a live event (trace's common case, so first)
            return (pid, tracker.generation_at(pid, sample.time_ns),
                    (sample.callchain, sample.return_address), sample.kernel)
        if sample.time_ns or sample.regs is not None or not tracker.generations.get(pid):
            generation = tracker.generation_at(pid, sample.time_ns)
        else:                          # counted in the kernel: no time to go by
            # (Python, Ruby and JS frames' words and the walk's markers are
            # no addresses: none is below LOWEST_FRAME_TAG)
            generation = tracker.generation_holding(pid, [
                a for a in callchain_addresses(sample.callchain) if a < LOWEST_FRAME_TAG])
        find = tracker.find            # the current generation's maps …
        if sample.regs is not None and generation != tracker.generations.get(pid, 0):
            # … unless a DWARF sample is unwound now in an earlier one
            find = lambda p, addr: tracker.find(p, addr, generation)   # noqa: E731
        return (pid, generation, self.unwinder.stack_key(sample, find), sample.kernel)

    def stack(self, sample: RawSample) -> Stack:
        """The symbolized stack of a sample, as it is now: one with JIT
        frames no map named is named again once its process's map changed
        (a JVM's, written by jcmd during the run). Cached by key: the same
        key gives the same Stack object (a report may cache by it)."""
        key = self.key(sample)
        if self.symbolizer.debug_arrived():
            self._stacks.clear()
        cached = self._stacks.get(key)      # (Stack, its JIT map's version or None)
        if cached is not None and (cached[1] is None or
                                   cached[1] == self.symbolizer.jit_version(key[0])):
            return cached[0]
        if len(self._stacks) > MAX_CACHED:
            self._stacks.clear()
        stack = self.stack_of(key)
        self._stacks[key] = (stack, self.symbolizer.jit_version(key[0])
                             if any(unnamed_jit(f) for f in stack.frames) else None)
        return stack

    def stacks(self, samples: list) -> list:
        """stack() of each sample, in order: the loop of a stack per event.
        A walked stack of a live event (the common case) whose Stack is
        cached and names no JIT code is found here with the key() made
        inline; any other goes through stack()."""
        out = []
        if self.symbolizer.debug_arrived():
            self._stacks.clear()
        append, cached_of, stack = out.append, self._stacks.get, self.stack
        tracker = self.tracker
        generations, exec_times = tracker.generations, tracker.exec_times
        for s in samples:
            if s.regs is None and s.time_ns and type(s) is RawSample:
                pid = s.pid
                times = exec_times.get(pid)
                cached = cached_of((
                    pid, generations.get(pid, 0) if not times or s.time_ns >= times[-1]
                    else tracker.generation_at(pid, s.time_ns),
                    (s.callchain, s.return_address), s.kernel))
                if cached is not None and cached[1] is None:
                    append(cached[0])
                    continue
            append(stack(s))
        return out

    def _maps_seen(self, pid: int, generation: int | None) -> bool:
        tracker = self.tracker
        gen = tracker.generations.get(pid, 0) if generation is None else generation
        pm = tracker.procs.get((pid, gen))
        return pm is not None and bool(pm.maps)

    def _runs_jvm(self, pid: int, generation: int | None) -> bool:
        tracker = self.tracker
        gen = tracker.generations.get(pid, 0) if generation is None else generation
        pm = tracker.procs.get((pid, gen))
        return pm is not None and any(m.path.endswith("/" + LIBJVM) for m in pm.maps)

    def stack_of(self, key: tuple) -> Stack:
        """The Stack of a key(), with the mappings of its exec generation
        (None: the latest), also after the process exited or exec'd."""
        pid, generation, skey, kernel = key
        self._view.generation = generation
        addrs, notes = self.unwinder.unwind_key(pid, skey, self._view.find)
        frames = self.symbolizer.frames(pid, addrs)
        if frames:
            self.symbolizer.stack_named(pid, frames, len(frames) < WALK_ENDED_BELOW and all(
                n in KERNEL_UNWIND_WHOLE.values() or n.startswith(CUT_IN_ANONYMOUS)
                for n in notes))
        if not frames and not kernel:
            if pid == 0:
                frames = (IDLE,)
            elif self.tracker.is_kernel_thread(pid):
                frames = (KERNEL_THREAD,)
        if addrs and pid > 0 and not self._maps_seen(pid, generation):
            notes = notes + (NO_MAPS,)
        elif frames and self.fp_advice and isinstance(skey[0], bytes):
            if self.java and any(unnamed_jit(f) for f in frames) and \
                    self._runs_jvm(pid, generation):
                notes = notes + (f"{JAVA_NOT_WALKED}; {self.fp_advice}",)
            elif not notes:
                cut = fp_cut_note(frames, self.fp_advice)
                if cut:
                    notes = (cut,)
        if kernel:
            frames = (self.symbolizer.kernel_frames(callchain_addresses(kernel))
                      + (SEPARATOR,) + frames)
        return Stack(frames, notes)


def python_warnings(names) -> list:
    """What the run's names of Python code objects said, if it has them."""
    python_code = names.made("python")
    return python_code.warnings if python_code is not None else []
