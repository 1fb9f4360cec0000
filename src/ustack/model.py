"""Plain data passed between the stages (see DESIGN.md: probes -> target ->
capture -> unwind -> symbolize -> report). No stage logic lives here."""
from __future__ import annotations

from collections import namedtuple
from .values import value


class UstackError(Exception):
    """An error the user can act on: printed as one line, exit status 1."""


# --- names -----------------------------------------------------------------

@value
class SymbolOptions:
    """What the user asked of names (the CLI's symbol flags)."""
    lines: bool = False            # --lines: file:line of each frame
    inlines: bool = False          # --inlines: inlined calls as frames of their own
    demangle: bool = True          # --no-demangle turns it off
    debug_dirs: tuple = ()         # --debug-dir: more places for debug files
    debuginfod: tuple = ()         # --debuginfod URLs, else DEBUGINFOD_URLS's
    name_sources: bool = False     # -v: say what named each object's frames
    java: bool = True              # --no-java: a JVM's Java frames not walked nor named
    fetch_wait_s: float = 0.0      # how long naming may wait for debuginfod's files, in
                                   # all: a report's (nothing is lost while it waits)


# --- probes ---------------------------------------------------------------

@value
class ProbeSpec:
    """One EVENT as the user spelled it, parsed but not yet resolved."""
    kind: str                      # uprobe | uretprobe | usdt | syscall | tracepoint | profile
    text: str                      # the original spelling, for messages
    path: str | None = None     # uprobe: binary path or library name
    function: str | None = None  # uprobe: symbol name or glob
    offset: int = 0                # uprobe: +0xOFF after the function
    address: int | None = None  # uprobe: PATH:0xADDR (ELF virtual address)
    group: str | None = None    # tracepoint group (syscalls for syscall:)
    name: str | None = None     # tracepoint / syscall / usdt name, may be a glob
    hz: int | None = None       # profile frequency
    args: tuple = ()               # uprobe fetch-args: (name, fetch, type) triples
    provider: str | None = None    # usdt: the provider (None: any), may be a glob


@value
class UprobeProbe:
    """A resolved uprobe: where the kernel puts the breakpoint."""
    spec: ProbeSpec
    path: str                      # real file on this host
    file_offset: int               # what uprobe_events / the uprobe PMU take
    address: int                   # ELF virtual address of the probed instruction
    symbol: str | None          # enclosing function, if known
    symbol_offset: int             # address - symbol start
    # Where the return address sits at the probed instruction, as a word
    # index from sp, when the frame pointer chain does not yet include it
    # (function entry, before `mov %rsp,%rbp`). None: the chain is complete.
    return_address_slot: int | None
    label: str                     # event name shown to the user
    fetch_args: tuple = ()         # 'name=fetch[:type]' words for uprobe_events
    arg_kinds: tuple = ()          # (name, how it prints: dec|hex|str|char|bool) per arg
    # a USDT probe's semaphore (file offset; 0: none): the kernel adds 1 to
    # it while the uprobe is in place, so the program's is-enabled test holds
    ref_ctr_offset: int = 0


@value
class TracepointProbe:
    spec: ProbeSpec
    group: str
    name: str
    label: str
    fields: tuple = ()             # fields of its record read with each event (--weight)


@value
class ProfileProbe:
    spec: ProbeSpec
    hz: int
    label: str


# --- target ---------------------------------------------------------------

@value
class Mapping:
    """One executable mapping of a process, as in /proc/PID/maps or MMAP2."""
    start: int
    end: int
    pgoff: int                     # file offset of `start`
    path: str                      # path as the process sees it
    host_path: str = ""            # where this tool can open it ("" = path)
    build_id: str = ""             # hex, when the kernel said (MMAP2 records)

    def contains(self, addr: int) -> bool:
        return self.start <= addr < self.end

    @property
    def open_path(self) -> str:
        return self.host_path or self.path


# --- capture --------------------------------------------------------------

# A callchain the kernel unwound with DWARF rules (capture/bpf_unwind.py)
# that stops short ends with the word KERNEL_UNWIND_STOP + reason, never a
# guessed frame; the unwind stage turns it into a note on the stack.
KERNEL_UNWIND_STOP = 0xFFFFFFFFFFFE0000   # below PERF_CONTEXT_* (0x...F000 up)
KERNEL_UNWIND_REASONS = {
    1: "the address is in no mapping",
    2: "code without a file (JIT?) has no unwind table",
    3: "no unwind table loaded yet for this object",
    4: "the object has no usable CFI",
    5: "no CFI covers this address",
    6: "its CFI uses a rule the in-kernel unwinder does not evaluate",
    7: "rbp was lost in an earlier frame",
    8: "the stack could not be read",
    9: "the caller's frame is not above this one on the stack (its rule or the stack is not what it seems)",
    10: "stopped at the in-kernel frame limit",
    11: "the process's memory map was locked",
    12: "the in-kernel unwind table was full when this object was loaded "
        "(--unwind-memory MIB makes it bigger)",
    20: "its CFA is rbx-based (ld.so's lazy-binding resolver) and rbx is not known there",
}
# not a cut: the whole stack, through code without a file (JIT) on its
# frame pointer, as the copy path's unwinder goes (it says so too)
KERNEL_UNWIND_THROUGH_JIT = 13
JIT_NOTE = "frame pointer used for code without a file (JIT?)"
# the same through a file's code without CFI (V8's builtins in node)
KERNEL_UNWIND_THROUGH_NO_CFI = 15
NO_CFI_NOTE = "frame pointer used for code without CFI"
# whole native stacks whose Python frames (bpf/python.h) are not all shown
PYTHON_UNREADABLE_NOTE = ("a Python frame could not be read: an interpreter call "
                          "is shown as its C frame")
PYTHON_LEFT_NOTE = "Python frames were left over when the native stack ended"
PYTHON_LOOP_NOTE = ("the Python frame chain loops back on itself (damaged memory): "
                    "shown up to the loop, the interpreter calls past it as C frames")
PYTHON_NO_THREAD_NOTE = ("the thread's Python state was not found (a thread starting or "
                         "ending): its interpreter calls are shown as C frames")
PYTHON_NO_FRAME_NOTE = ("the thread had no current Python frame (a thread or an interpreter "
                        "starting or ending): its interpreter calls are shown as C frames")
# the same of PHP frames (bpf/php.h)
PHP_UNREADABLE_NOTE = ("a PHP frame could not be read: an executor call "
                       "is shown as its C frame")
PHP_LEFT_NOTE = "PHP frames were left over when the native stack ended"
# a runtime's in-kernel pass (bpf/unwind.bpf.c's pass_*) did not load
PASS_MISSING_NOTE = ("an interpreter's frames were not read: its in-kernel pass "
                     "did not load; its calls are shown as their C frames")
# complete stacks whose marker word only says how they were walked
KERNEL_UNWIND_WHOLE = {KERNEL_UNWIND_THROUGH_JIT: JIT_NOTE,
                       KERNEL_UNWIND_THROUGH_NO_CFI: NO_CFI_NOTE,
                       17: PYTHON_UNREADABLE_NOTE, 18: PYTHON_LEFT_NOTE,
                       19: PYTHON_LOOP_NOTE,
                       21: PHP_UNREADABLE_NOTE, 22: PHP_LEFT_NOTE, 23: PASS_MISSING_NOTE,
                       24: PYTHON_NO_THREAD_NOTE, 25: PYTHON_NO_FRAME_NOTE}
# A Python frame inside a native callchain: the in-kernel walk puts it where
# the eval loop's C frame that ran it was. One word: PYTHON_FRAME_TAG, the
# code object's address >> 3 (it is 8-aligned; 44 bits hold any user
# address) in bits 16-59, and the index of the instruction the frame was
# at, in 2-byte code units from the start of its bytecode (clamped to
# 0xFFFF), in bits 0-15. Tagged words sit far above user addresses and
# below KERNEL_UNWIND_STOP's markers.
PYTHON_FRAME_TAG = 0xE000000000000000
PYTHON_INDEX_MAX = 0xFFFF


def python_frame_word(code: int, index: int) -> int:
    """The callchain word of a Python frame (see PYTHON_FRAME_TAG)."""
    return PYTHON_FRAME_TAG | (code >> 3) << 16 | min(index, PYTHON_INDEX_MAX)


def python_frame_parts(word: int) -> tuple | None:
    """(code object address, code unit index) of a Python frame's word, or
    None for any other word."""
    if word >> 60 != PYTHON_FRAME_TAG >> 60:
        return None
    return ((word >> 16) & ((1 << 44) - 1)) << 3, word & PYTHON_INDEX_MAX


# A JS frame of a V8 process (node) named in the kernel (bpf/v8.h): its word
# replaces the JIT or builtin pc the walk found there. V8_FRAME_TAG, the
# SharedFunctionInfo's tagged address >> 3 in bits 16-59, and in bits 0-15
# the interpreted frame's bytecode offset as V8 keeps it (from the tagged
# BytecodeArray pointer), V8_NO_OFFSET where the frame is not interpreted.
V8_FRAME_TAG = 0xD000000000000000
V8_NO_OFFSET = 0xFFFF


def v8_frame_word(shared: int, offset: int = V8_NO_OFFSET) -> int:
    """The callchain word of a JS frame (see V8_FRAME_TAG)."""
    return V8_FRAME_TAG | (shared >> 3) << 16 | min(offset, V8_NO_OFFSET)


def v8_frame_parts(word: int) -> tuple | None:
    """(SharedFunctionInfo's tagged address, bytecode offset or
    V8_NO_OFFSET) of a JS frame's word, or None for any other word."""
    if word >> 60 != V8_FRAME_TAG >> 60:
        return None
    return ((word >> 16) & ((1 << 44) - 1)) << 3 | 1, word & V8_NO_OFFSET


# A PHP frame inside a native callchain (bpf/php.h): the in-kernel walk
# puts it where the executor's C frame (execute_ex) that ran it was.
# PHP_FRAME_TAG, the id the kernel gave its function in bits 16-59 (its
# names: capture/bpf_php.py), the line of the frame's opline in bits 0-15
# (0: a builtin's frame, or unknown).
PHP_FRAME_TAG = 0xC000000000000000
PHP_LINE_MAX = 0xFFFF


def php_frame_parts(word: int) -> tuple | None:
    """(function id, line) of a PHP frame's word, or None for any other word."""
    if word >> 60 != PHP_FRAME_TAG >> 60:
        return None
    return (word >> 16) & ((1 << 44) - 1), word & PHP_LINE_MAX
# A Perl frame inside a native callchain (bpf/perl.h): the in-kernel walk
# puts a run loop's Perl frames where its C frame was. PERL_FRAME_TAG, the
# sub's CV address >> 3 in bits 16-59 (the main program's body: PL_main_cv),
# and the line the frame is at in bits 0-15 (clamped to PERL_LINE_MAX).
PERL_FRAME_TAG = 0xB000000000000000
PERL_LINE_MAX = 0xFFFF


def perl_frame_word(cv: int, line: int) -> int:
    """The callchain word of a Perl frame (see PERL_FRAME_TAG)."""
    return PERL_FRAME_TAG | (cv >> 3) << 16 | min(line, PERL_LINE_MAX)


def perl_frame_parts(word: int) -> tuple | None:
    """(CV address, line) of a Perl frame's word, or None for any other word."""
    if word >> 60 != PERL_FRAME_TAG >> 60:
        return None
    return ((word >> 16) & ((1 << 44) - 1)) << 3, word & PERL_LINE_MAX


# A Ruby frame inside a native callchain: the in-kernel walk (bpf/ruby.h)
# puts it where the rb_vm_exec frame of the VM call that ran it was.
# RUBY_FRAME_TAG, the iseq body's address >> 3 in bits 16-59, and in bits
# 0-15 the frame's pc as an index in words from the iseq's start (the
# instruction after the one running, as Ruby keeps it; clamped to 0xFFFF).
RUBY_FRAME_TAG = 0xA000000000000000
RUBY_INDEX_MAX = 0xFFFF
# A Java frame of a HotSpot JVM, walked in user space from a copied stack
# (unwind/hotspot_live.py), in place of the JIT or interpreter pc it ran:
# JAVA_FRAME_TAG, its Method* >> 3 in bits 16-59, bit 15 set for a method
# inlined into its caller's compiled code, and in bits 0-14 its bytecode
# index (JAVA_NO_BCI where not known).
JAVA_FRAME_TAG = 0x9000000000000000
JAVA_NO_BCI = 0x7FFF
JAVA_INLINED = 0x8000
# the bci of a word naming the JVM's generated code (a stub, the
# interpreter where no method is found): its CodeBlob's address in place
# of the Method*
JAVA_BLOB = 0x7FFE
# the lowest tag of an interpreter's frame word: words from it up are no
# addresses
LOWEST_FRAME_TAG = JAVA_FRAME_TAG


def java_frame_word(method: int, bci: int = JAVA_NO_BCI, inlined: bool = False) -> int:
    """The callchain word of a Java frame (see JAVA_FRAME_TAG)."""
    return (JAVA_FRAME_TAG | (method >> 3) << 16 | (JAVA_INLINED if inlined else 0)
            | (bci if 0 <= bci < JAVA_BLOB or bci == JAVA_BLOB else JAVA_NO_BCI))


def java_frame_parts(word: int) -> tuple | None:
    """(Method* address, bci, inlined) of a Java frame's word, or None for
    any other word."""
    if word >> 60 != JAVA_FRAME_TAG >> 60:
        return None
    return (((word >> 16) & ((1 << 44) - 1)) << 3, word & JAVA_NO_BCI,
            bool(word & JAVA_INLINED))


def ruby_frame_word(body: int, index: int) -> int:
    """The callchain word of a Ruby frame (see RUBY_FRAME_TAG)."""
    return RUBY_FRAME_TAG | (body >> 3) << 16 | min(index, RUBY_INDEX_MAX)


def ruby_frame_parts(word: int) -> tuple | None:
    """(iseq body address, pc index) of a Ruby frame's word, or None for
    any other word."""
    if word >> 60 != RUBY_FRAME_TAG >> 60:
        return None
    return ((word >> 16) & ((1 << 44) - 1)) << 3, word & RUBY_INDEX_MAX


# A callchain that fills ftrace's userstacktrace (FTRACE_STACK_ENTRIES: 8
# frames) ends with FTRACE_STACK_FULL: the walk stopped there, not at the
# root; the unwind stage turns it into FTRACE_STACK_FULL_NOTE.
FTRACE_STACK_FULL = KERNEL_UNWIND_STOP + 0x100
FTRACE_STACK_FULL_NOTE = ("stack cut at ftrace's 8-frame limit (userstacktrace): "
                          "--backend bpf or perf give the whole stack")


# a DWARF sample's regs: the address of the second copy its stack holds
# (from rbp, a frame on another stack: Go's vDSO calls), and its offset
OTHER_STACK, OTHER_AT = "other", "other_at"


class RawSample(namedtuple(
        "RawSample", "probe pid tid time_ns cpu callchain return_address regs stack args kernel",
        defaults=(b"", b"", None, None, (), b""))):
    """One event as a capture yields it, before unwinding: self-contained,
    so any consumer (the unwinder, a record file, a test) reads it without
    asking the capture that made it. A tuple, since millions are made.

    A frame-pointer sample carries `callchain`, the return addresses the
    kernel walked (u64 little-endian, innermost first, the probed ip first)
    and, at a function-entry uprobe, `return_address`: the 8 bytes at the
    probe's return_address_slot, the caller the walk cannot see yet. A DWARF
    sample carries `regs` (ip, sp, bp) and `stack`, the bytes copied from sp
    upward, for the DWARF unwinder instead; where rbp pointed to another
    stack, `stack` ends with a copy from there: regs[OTHER_STACK] is its
    address, regs[OTHER_AT] where it begins in `stack`.

    probe: index of the probe in the run's list; time_ns: CLOCK_MONOTONIC,
    as perf and ftrace stamp it; regs: {'ip', 'sp', 'bp'} or None; stack:
    bytes-like (a memoryview of the record) or None; args: fetch-arg values,
    (name, kind, int | bytes); kernel: kernel frames (u64s, innermost
    first) with --kernel. (collections.namedtuple, not typing's: importing
    typing cost ~4 ms of every start-up.)"""
    __slots__ = ()


class UnwoundSample(RawSample):
    """A RawSample whose stack was unwound already: a DWARF sample unwound
    while it was recorded, so the recording keeps a few addresses instead
    of 8 KiB of stack. `unwound` is (return addresses innermost first,
    notes), what the DWARF unwinder gave; `callchain` holds the same
    addresses; `regs` and `stack` are None. Make it with `unwound_sample`
    (_replace loses `unwound`)."""
    unwound: tuple = ((), ())


class PythonSample(RawSample):
    """A DWARF RawSample of a CPython thread with the thread's Python frames
    read from the process's memory as the sample came off the ring (the
    copy path: the interpreter keeps its frames in heap memory the stack
    copy lacks). `python` is (groups, note, eval_ranges, current): groups
    of (code address, code-unit index), innermost first, one per C call of
    the eval function (unwind/python_frames.frame_groups); why they could
    not be read or trusted, or ""; the eval function's address ranges; the
    address of the thread's current Python frame. Make it with
    `python_sample`. The samples carry every general register."""
    python: tuple = ((), "", (), 0)


def python_sample(sample: RawSample, python: tuple) -> PythonSample:
    s = PythonSample(*sample)
    s.python = python
    return s


def unwound_sample(sample: RawSample, addrs: tuple, notes: tuple) -> UnwoundSample:
    s = UnwoundSample(sample.probe, sample.pid, sample.tid, sample.time_ns,
                      sample.cpu, b"".join(a.to_bytes(8, "little") for a in addrs),
                      b"", None, None, sample.args, sample.kernel)
    s.unwound = (addrs, notes)
    return s


class Event(namedtuple("Event", "sample label comm stack")):
    """A sample with its names: what `Session.events()` yields: the
    RawSample, the event's label as the header shows it, the comm, the
    symbolized Stack."""
    __slots__ = ()


class Piece(namedtuple("Piece", "metas samples")):
    """A step of the stream: the records that explain samples (mappings,
    comm, fork, exit) in time order (`metas`), then the samples they
    explain (`samples`), two lists."""
    __slots__ = ()


@value
class Losses:
    """What a capture could not deliver, for the run's summary."""
    lost: int = 0                  # events the kernel buffers dropped
    throttled: int = 0             # times the kernel throttled sampling
    # events an in-kernel counter saw but could not count: (why, n) pairs
    uncounted: tuple = ()
    # events whose stack the in-kernel unwinder cut short: (why, n) pairs
    # (each such stack ends with a note saying where and why)
    cut_short: tuple = ()
    # of those, the ones cut because the ring of stacks to finish in Python
    # (an object's rows not loaded yet) was full
    deferral_full: int = 0
    # events the kernel ran none of ustack's programs for: a BPF program or
    # a bpf() call was running on that CPU already (bpf_prog_info's
    # recursion_misses)
    skipped: int = 0
    # events that reached ustack but were not reported: the run was asked
    # to end (Ctrl-C) while they waited to be read
    dropped: int = 0
    # records other than events (fork, exec, mmap) the kernel buffers dropped
    records_lost: int = 0


@value
class MmapEvent:
    pid: int
    tid: int
    mapping: Mapping


@value
class CommEvent:
    pid: int
    tid: int
    comm: str
    exec: bool                     # True when the comm changed through execve
    time_ns: int = 0               # when (the samples' clock), 0 if unknown


@value
class ForkEvent:
    pid: int
    ppid: int
    tid: int
    ptid: int


@value
class ExitEvent:
    """A thread exited (the process too when pid == tid)."""
    pid: int
    ppid: int
    tid: int
    ptid: int


# --- unwind / symbolize ---------------------------------------------------

@value
class Frame:
    """One symbolized frame. `offset` is addr - function start, as perf and
    SystemTap print it; `size` is the function's size (0 if unknown). An
    inlined frame shares `addr` with the frame it was inlined into, which
    follows it in the stack."""
    addr: int
    module: str                    # basename of the mapped file, '' if unknown
    function: str | None = None
    offset: int = 0
    size: int = 0
    path: str = ""
    file: str = ""                 # source file, when lines were asked for
    line: int = 0                  # 0: unknown
    inlined: bool = False          # a call inlined into the frame that follows
    kind: str = ""                 # "" native; "python", "php", "perl", "ruby", "js", "java": an interpreter's
                                   # or a JIT's frame (reports colour and label them)
    # A frame of a file's code that no symbol names keeps where it is in its
    # object (ELF addresses, the same in every process), so that it is still
    # told apart from other unnamed code: `objaddr` the pc's, `objstart` the
    # start of the code the object's CFI gives for it (an FDE), 0 if none.
    objaddr: int = 0
    objstart: int = 0

    # Not a field (no part of equality, hash or repr): what a sink names
    # the frame by in its tables, a function of the fields above but the
    # address, kept on the object by the sink that first reads them
    # (report/sinks/clickhouse_schema.py), so that a frame met again, or
    # its copy at another address (copied with the object's attributes),
    # is never read again; None until then.
    sink_id = None


# kinds of a script's frame: no address or object of its own, named by
# function, source file and line (reports show them alike)
SCRIPT_KINDS = frozenset(("python", "php", "perl", "ruby"))


def printable(text: str) -> str:
    """text with every character a terminal or a line-based format would
    act on (NUL, escapes, newlines, other controls) written as an escape,
    `\\x1b`: names come from files and processes anyone can make, and a
    name must never end a folded line, forge a frame or drive a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def unnamed_function(f: Frame) -> str | None:
    """What stands for the function of a frame that has no name but a place
    in its object: `fn@0x11e0` (the start the object's CFI gives), else the
    pc's own address `0x11f6`; None when the frame has neither (a name, or
    memory outside any file). Every output shows this, with the module, so
    that two unnamed functions are never counted as one."""
    if f.function is not None or not f.objaddr:
        return None
    if f.objstart:
        return f"fn@0x{f.objstart:x}"
    return f"0x{f.objaddr:x}"


@value
class PythonCodeInfo:
    """What names a Python code object (symbols/python.py reads it from the
    process; a recording keeps it, as the process is gone when it is read)."""
    name: str                      # co_qualname (3.11+), co_name before
    file: str                      # co_filename
    firstlineno: int
    table_kind: str                # "lnotab" (3.8, 3.9), "linetable" (3.10), "locations"
    table: bytes                   # the line table's bytes


@value
class Stack:
    """A symbolized user stack, innermost frame first."""
    frames: tuple
    notes: tuple = ()              # what went wrong while unwinding, for the user

    # Not a field: what a sink names the stack by (a function of its frames'
    # names and its notes), kept on the object as Frame.sink_id is; None until then.
    sink_id = None


@value(frozen=False)
class StackCount:
    """What the report stage aggregates: a stack seen `count` times. A BPF
    backend produces these directly; the perf backend counts samples."""
    comm: str
    pid: int
    stack: Stack
    count: int
    event: str = ""
    tid: int = 0                   # counted per thread (-T); else 0
    ns_pid: int = 0                # pid and tid in the process's own pid
    ns_tid: int = 0                # namespace (a container's), 0: as ours
