"""A Ruby thread's frames read from its live process, for the stacks ustack
unwinds itself (script_live.py): what bpf/ruby.h reads in the kernel, in
user space, with the layout of unwind/ruby_runtime.py.

The kernel reaches a thread's execution context through its fsbase (the
thread-local ruby_current_ec), which user space does not see; here the
VM's thread list does it: ruby_current_vm_ptr's main thread and the
threads beside it in its ractor's list (lt_node, each checked by its vm
field pointing back), each with its ec (the fiber running) and its
pthread_t, whose struct pthread holds the kernel's thread id.

Then the control frames from ec->cfp to the VM stack's end, as ruby.h
walks them: a frame with an iseq (not a C function's, not the thread's
dummy first one) is a Ruby frame, word model.ruby_frame_word(body, pc
index); a VM call's group ends at its FINISH frame. Each iseq met is told
to the run's RubyIseqs (symbols/ruby.py) with its label object and, for
a method's frame, its method entry (its class), methods first, as the
capture's harvest of the kernel's RUBY_ISEQS does."""
from __future__ import annotations

import struct
import time

from ..kernel.procfs import ProcessMemory
from ..model import RUBY_INDEX_MAX, ruby_frame_word
from . import ruby_runtime
from .python_live import TID_OFFSET
from .script_live import ScriptRuntime

FLAG_FINISH = 0x0020            # ruby.h's RUBY_FLAG_FINISH
FLAG_CFRAME = 0x0080            # RUBY_FLAG_CFRAME
MAGIC_MASK = 0x7FFF0001
MAGIC_DUMMY = 0x79990001        # a thread's first frame
MAGIC_METHOD = 0x11110001       # a method's frame
EP_ME_CREF = 16                 # bytes below ep: a method frame's method entry
MAX_CFPS = 2048                 # control frames read at most (ruby.h's RUBY_MAX_CFPS)
MAX_THREADS = 4096              # threads of the VM's list looked at
REREAD_S = 0.01                 # an unknown thread: the list re-read at most this often
_CFP = struct.Struct("<QQQQQ")  # pc, sp, iseq, self, ep: a control frame's first words


class _Process:
    __slots__ = ("mem", "f", "vm_at", "threads", "read_at", "seen", "in_c")

    def __init__(self, mem: ProcessMemory, f: dict, vm_at: int):
        self.mem, self.f, self.vm_at = mem, f, vm_at
        self.threads: dict = {}         # tid -> rb_thread_t address
        self.read_at = -1.0
        self.seen: list = []            # the last read's (body, label, method entry)
        self.in_c = False               # the last read's innermost frame is a C function's


class RubyLive(ScriptRuntime):
    """`iseqs`: the run's RubyIseqs (symbols/ruby.py), which names the
    frames read."""

    def __init__(self, iseqs):
        self.iseqs = iseqs

    def detect(self, path: str):
        runtime = ruby_runtime.object_runtime(path)
        return runtime if runtime is not None and runtime.vm_ptr else None

    def vm_range(self, runtime) -> tuple:
        return runtime.exec_start, runtime.exec_end

    def open(self, pid: int, runtime, bias: int, mem: ProcessMemory):
        return _Process(mem, dict(runtime.layout), bias + runtime.vm_ptr)

    def read(self, proc: _Process, pid: int, tid: int) -> list | None:
        thread = proc.threads.get(tid)
        if thread is None:
            now = time.monotonic()
            if now - proc.read_at < REREAD_S:
                return None
            proc.read_at = now
            proc.threads = _threads(proc)
            thread = proc.threads.get(tid)
            if thread is None:
                return None
        return _groups(proc, thread)

    def agrees(self, proc: _Process, innermost: int) -> bool:
        # the sample ran VM code (its pc in rb_vm_exec or the VM loop it
        # calls) where the read finds a C method running
        return not (proc.in_c and innermost <= 1)

    def named(self, proc: _Process, pid: int) -> None:
        if self.iseqs is None:
            return
        # methods first: a block is named by its method's class (symbols/ruby.py)
        for body, label, me in sorted(proc.seen, key=lambda s: s[2] == 0):
            try:
                self.iseqs.remember(pid, body, label, me)
            except (OSError, ValueError, OverflowError):
                pass


def _threads(proc: _Process) -> dict:
    """{tid: rb_thread_t address} of the VM's threads: the main one and
    those of its ractor's list (whose head, inside the ractor, is no
    thread: its vm field is not the VM)."""
    mem, f = proc.mem, proc.f
    vm = mem.word(proc.vm_at)
    if not vm:
        return {}
    main = mem.word(vm + f["vm_main_thread"])
    found: dict = {}
    node, steps = main, 0
    while node and steps < MAX_THREADS:
        steps += 1
        if mem.word(node + f["thread_vm"]) == vm:
            pthread = mem.word(node + f["thread_id"])
            # a pthread_t is its struct pthread, whose header points at itself
            if pthread and mem.word(pthread + 16) == pthread:
                found[struct.unpack("<I", mem.read(pthread + TID_OFFSET, 4))[0]] = node
        node = mem.word(node)               # lt_node.next: the list node is the thread's start
        if node == main:
            break
    return found


def _groups(proc: _Process, thread: int) -> list | None:
    """The thread's Ruby frames by VM call (ruby.h's merge), innermost
    first; None where its context cannot be read."""
    mem, f = proc.mem, proc.f
    ec = mem.word(thread + f["thread_ec"])
    if not ec or mem.word(ec + f["ec_thread"]) != thread:
        return None
    stack = mem.word(ec + f["ec_vm_stack"])
    words = mem.word(ec + f["ec_vm_stack_size"])
    cfp = mem.word(ec + f["ec_cfp"])
    if not stack or not words or words > 1 << 28:
        return None
    end = stack + 8 * words
    size = f["cfp_size"]
    if not stack <= cfp < end:
        return None
    count = min((end - cfp) // size, MAX_CFPS)
    frames = mem.read(cfp, count * size)
    groups: list = []
    group: list = []
    seen: list = []
    for i in range(count):
        pc, _sp, iseq, _self, ep = _CFP.unpack_from(frames, i * size)
        flags = mem.word(ep)
        magic = flags & MAGIC_MASK
        if i == 0:
            proc.in_c = bool(flags & FLAG_CFRAME)
        if not flags & FLAG_CFRAME and magic != MAGIC_DUMMY and iseq:
            body = mem.word(iseq + f["iseq_body"])
            encoded = mem.word(body + f["body_iseq_encoded"]) if body else 0
            if body and encoded and not body & 7:
                index = min((pc - encoded) // 8 if pc >= encoded else 0, RUBY_INDEX_MAX)
                group.append(ruby_frame_word(body, index))
                label = mem.word(body + f["body_location"] + f["location_label"])
                if label:
                    me = mem.word(ep - EP_ME_CREF) if magic == MAGIC_METHOD else 0
                    seen.append((body, label, me))
        if flags & FLAG_FINISH and magic != MAGIC_DUMMY:
            groups.append(tuple(group))
            group = []
    if group:
        groups.append(tuple(group))
    proc.seen = seen
    return groups
