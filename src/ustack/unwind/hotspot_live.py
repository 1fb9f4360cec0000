"""Java frames of copied stacks (a JVM's samples, which the kernel hands to
user space with their stack: its walk has no CFI for the JIT's code, and
HotSpot keeps no frame pointer in compiled code by default), walked here
from the copy as each comes off the ring, while its process lives.

A pc in the JVM's code cache is looked up in its heaps' segment maps
(CodeHeap::_segmap: how far back the block holding a segment starts) to
the CodeBlob holding it; a blob is an nmethod (C1/C2 code: the caller's sp
is sp + its frame size, the caller's rbp saved just below the return
address), the template interpreter (rbp chains its frames; the Method* and
bytecode pointer sit in fixed slots below rbp), or a stub (the call stub
and others, which push rbp). Each Java frame becomes a Java word
(model.java_frame_word: its Method* and bci); the name is read now, from
Method -> ConstMethod -> ConstantPool -> holder class, each checked by
what points back (the class's constant pool is that pool, the blob's name
is "nmethod"), and kept by `remember` for the symbols stage. Native code
between Java frames (the VM, JNI) is walked by its CFI (dwarf.py) as any.

Not followed: methods inlined into a compiled one (its scopes' debug info
is not read: the frame shows the method that was compiled).

Not thread-safe: the thread that unwinds the deferred stacks calls it all."""
from __future__ import annotations

import struct

from ..kernel.procfs import ProcessMemory
from ..model import JAVA_NO_BCI, java_frame_word
from . import hotspot_runtime
from .dwarf import UNMAPPED_NOTE as _UNMAPPED

MAX_PROCS = 256                 # processes whose memory is kept open
MAX_JAVA_FRAMES = 1024
_Q = struct.Struct("<Q")
_MAX_BLOBS = 1 << 16            # cached blobs per process before the cache is dropped
_HEAPS_TTL = 1 << 12            # lookups before a process's code heaps are read again
CUT_NOTE = "stack cut in Java code: no caller found where the frame says"


class _Heap:
    __slots__ = ("low", "high", "segmap", "log2")

    def __init__(self, low, high, segmap, log2):
        self.low, self.high, self.segmap, self.log2 = low, high, segmap, log2


class _Blob:
    """What the walk needs of one CodeBlob."""
    __slots__ = ("start", "end", "kind", "frame_size", "complete", "method")
    NMETHOD, INTERPRETER, STUB = range(3)

    def __init__(self, start, end, kind, frame_size, complete, method):
        self.start, self.end, self.kind = start, end, kind
        self.frame_size, self.complete, self.method = frame_size, complete, method


class _Process:
    __slots__ = ("pid", "f", "mem", "heaps", "low", "high", "blobs", "names", "strings",
                 "bias", "uses")

    def __init__(self, pid: int, f: dict, mem: ProcessMemory, bias: int):
        self.pid, self.f, self.mem, self.bias = pid, f, mem, bias
        self.heaps: list = []
        self.low = self.high = 0
        self.blobs: dict = {}           # block start -> _Blob | None
        self.names: dict = {}           # Method* -> name | None
        self.strings: dict = {}         # a blob's _name pointer -> the string
        self.uses = 0


class HotSpotLive:
    """The Java frames of copied stacks, per JVM process as each is met.
    `remember(pid, method, name)` is told each method named."""

    def __init__(self, remember=None):
        self.remember = remember
        self._procs: dict = {}          # pid -> _Process, or None: not a JVM
        self.cut = 0                    # stacks cut in Java code (a frame not followed)

    def forget(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.mem.close()

    def close(self) -> None:
        for pid in list(self._procs):
            self.forget(pid)

    def process(self, pid: int) -> _Process | None:
        """pid's JVM, or None where it runs none (its maps read once)."""
        if pid in self._procs:
            return self._procs[pid]
        proc = None
        jvm = hotspot_runtime.libjvm_of(pid)
        if jvm is not None:
            path, bias = jvm
            try:
                mem = ProcessMemory(pid)
            except OSError:
                return None
            layout = hotspot_runtime.layout_of(path, bias, mem)
            if layout is None:
                mem.close()
            else:
                proc = _Process(pid, layout.as_dict(), mem, bias)
        if len(self._procs) >= MAX_PROCS:
            self.forget(next(iter(self._procs)))
        self._procs[pid] = proc
        return proc

    # --- the walk ----------------------------------------------------------

    def unwind(self, pid: int, regs: dict, stack: bytes, find, dwarf,
               sps: list | None = None) -> tuple | None:
        """(addresses innermost first, notes) of a copied stack of a JVM
        whose walk meets its code cache, Java frames as Java words; None
        where pid runs no JVM (dwarf.unwind's answer is the one then).
        `find(addr)`: pid's mapping there; `dwarf`: the DwarfUnwinder;
        `sps`: a list given gets each frame's sp."""
        proc = self.process(pid)
        if proc is None:
            return None
        try:
            return self._walk(proc, regs, stack, find, dwarf, sps)
        except OSError:                 # the process is gone, or another has its pid
            self.forget(pid)
            return None

    def _walk(self, proc: _Process, regs: dict, stack: bytes, find, dwarf, sps) -> tuple:
        sp0 = regs["sp"]
        top = len(stack) - 8
        ip, sp, bp, bx = regs["ip"], sp0, regs.get("bp"), regs.get("bx")
        addrs: list = []
        notes: list = []
        exact = True
        low, high = proc.low, proc.high

        def native(addr):               # the code cache is walked here, not there
            return None if low <= addr < high else find(addr)

        def at(addr):                   # the copy's word at a stack address, or None
            o = addr - sp0
            return _Q.unpack_from(stack, o)[0] if 0 <= o <= top else None

        for _ in range(MAX_JAVA_FRAMES):
            if not proc.heaps:
                self._read_heaps(proc)
                low, high = proc.low, proc.high
            blob = self.blob_at(proc, ip if exact else ip - 1) if low <= ip < high else None
            if blob is None:
                o = sp - sp0
                if o < 0 or o > top:
                    break
                end: list = []
                sub_sps: list = []
                got, said = dwarf.unwind({"ip": ip, "sp": sp, "bp": bp, "bx": bx},
                                         stack[o:], native, sub_sps, end=end, exact=exact)
                addrs.extend(got)
                if sps is not None:
                    sps.extend(sub_sps)
                last = got[-1]
                if len(got) < 2 or not low <= last < high or end[1] is None:
                    notes.extend(said)
                    break               # the stack's root, or a cut the walk says
                notes.extend(n for n in said if n != _UNMAPPED)
                addrs.pop()             # the Java frame it returns to: walked here
                if sps is not None:
                    sps.pop()
                ip, (sp, bp), bx, exact = last, end, None, False
                continue
            step = self._step(proc, blob, ip, sp, bp, exact, at, find)
            if step is None:
                addrs.append(ip)
                if sps is not None:
                    sps.append(sp)
                notes.append(CUT_NOTE)
                self.cut += 1
                break
            word, ip, sp, bp = step
            addrs.append(word)
            if sps is not None:
                sps.append(sp)
            exact = False
            bx = None
        else:
            notes.append(f"stopped after {MAX_JAVA_FRAMES} frames")
        return tuple(addrs), tuple(notes)

    def _step(self, proc: _Process, blob: _Blob, ip: int, sp: int, bp, exact: bool,
              at, find) -> tuple | None:
        """(this frame's word, the caller's ip, sp, bp), or None where the
        caller is not found."""
        if blob.kind == _Blob.INTERPRETER or (blob.kind == _Blob.STUB and blob.frame_size <= 0):
            # rbp frames: the interpreter's, the call stub's
            if bp is None or bp < sp:
                return None
            ra, link = at(bp + 8), at(bp)
            if ra is None or link is None:
                return None
            word = ip
            caller_sp = bp + 16
            if blob.kind == _Blob.INTERPRETER:
                method = at(bp + 8 * hotspot_runtime.INTERP_METHOD)
                bcp = at(bp + 8 * hotspot_runtime.INTERP_BCP)
                if method is not None and self.method_name(proc, method) is not None:
                    word = java_frame_word(method, self.bci(proc, method, bcp or 0))
                # a compiled caller's frame is sized from the sp it called
                # with, which the interpreter keeps (its locals extend it)
                sender = at(bp + 8 * hotspot_runtime.INTERP_SENDER_SP)
                if sender is not None and sp < sender <= caller_sp + (1 << 20):
                    caller_sp = sender
            if not self._plausible(proc, ra, find):
                return None
            return word, ra, caller_sp, link
        word = ip
        if blob.kind == _Blob.NMETHOD and self.method_name(proc, blob.method) is not None:
            word = java_frame_word(blob.method)
        if exact and ip < blob.complete:
            # its prologue: the return address at sp, or above the rbp it pushed
            for slot in (sp, sp + 8):
                ra = at(slot)
                if ra is not None and self._plausible(proc, ra, find):
                    return word, ra, slot + 8, bp
            return None
        sender = sp + blob.frame_size
        ra, link = at(sender - 8), at(sender - 16)
        if ra is not None and self._plausible(proc, ra, find):
            return word, ra, sender, link
        if exact:
            # its epilogue: the frame popped, rbp restored, the return address at sp
            ra = at(sp)
            if ra is not None and self._plausible(proc, ra, find):
                return word, ra, sp + 8, bp
        return None

    def _plausible(self, proc: _Process, ra: int, find) -> bool:
        """Whether ra may be a return address: in a blob's code, or in a
        file's mapping."""
        if proc.low <= ra < proc.high:
            return self.blob_at(proc, ra - 1) is not None
        m = find(ra)
        return m is not None and m.path.startswith("/")

    # --- the code cache ----------------------------------------------------

    def _read_heaps(self, proc: _Process) -> None:
        f, mem = proc.f, proc.mem
        heaps = []
        array = mem.word(proc.bias + f["heaps"])
        n = struct.unpack("<i", mem.read(array + f["array_len"], 4))[0]
        data = mem.word(array + f["array_data"])
        for i in range(min(max(n, 0), 8)):
            heap = mem.word(data + 8 * i)
            low = mem.word(heap + f["heap_memory"] + f["space_low"])
            high = mem.word(heap + f["heap_memory"] + f["space_high"])
            segmap = mem.word(heap + f["heap_segmap"] + f["space_low"])
            log2 = struct.unpack("<i", mem.read(heap + f["heap_log2_segment"], 4))[0]
            if 0 < low < high and 0 < log2 < 16:
                heaps.append(_Heap(low, high, segmap, log2))
        proc.heaps = heaps
        proc.low = min((h.low for h in heaps), default=0)
        proc.high = max((h.high for h in heaps), default=0)

    def blob_at(self, proc: _Process, pc: int) -> _Blob | None:
        """The CodeBlob holding pc, or None (not in the code cache, or a
        free block)."""
        if proc.uses % _HEAPS_TTL == 0 or not proc.heaps:
            self._read_heaps(proc)      # heaps grow (committed memory) as code comes
        proc.uses += 1
        if not proc.low <= pc < proc.high:
            return None
        for heap in proc.heaps:
            if heap.low <= pc < heap.high:
                break
        else:
            return None
        mem = proc.mem
        index = (pc - heap.low) >> heap.log2
        # each byte: how many segments back the block goes (at most 0xFE a
        # step); 0xFF: free
        for _ in range(64):
            back = mem.read(heap.segmap + index, 1)[0]
            if back == 0xFF:
                return None
            if back == 0:
                break
            index -= back
        else:
            return None
        block = heap.low + (index << heap.log2)
        return self._blob(proc, block, pc)

    def _blob(self, proc: _Process, block: int, pc: int) -> _Blob | None:
        f, mem = proc.f, proc.mem
        # not cached across samples: a freed block is soon another blob
        # (a recompiled method); its header is read each time (~5 reads)
        header = mem.read(block, f["heap_block"] + f["blob_name"] + 8)
        if not header[f["block_used"]]:
            return None
        blob = block + f["heap_block"]
        o = f["heap_block"]
        size = struct.unpack_from("<i", header, o + f["blob_size"])[0]
        code_begin, code_end = struct.unpack_from("<QQ", header, o + f["blob_code_begin"])
        if not code_begin <= pc < code_end or code_end > blob + size:
            return None
        complete = struct.unpack_from("<i", header, o + f["blob_frame_complete"])[0]
        frame_size = struct.unpack_from("<i", header, o + f["blob_frame_size"])[0]
        name_ptr = _Q.unpack_from(header, o + f["blob_name"])[0]
        name = proc.strings.get(name_ptr)
        if name is None:
            name = proc.strings[name_ptr] = hotspot_runtime.c_string(mem, name_ptr, 64)
        method = 0
        if name == "nmethod":
            kind = _Blob.NMETHOD
            method = mem.word(blob + f["nmethod_method"])
        elif name == "Interpreter":
            kind = _Blob.INTERPRETER
        else:
            kind = _Blob.STUB
        return _Blob(code_begin, code_end, kind, frame_size * 8,
                     code_begin + complete if complete >= 0 else code_begin, method)

    # --- names -------------------------------------------------------------

    def method_name(self, proc: _Process, method: int) -> str | None:
        """"pkg.Class.method" of a Method*, or None where what it points to
        is not a method's (checked by what points back)."""
        names = proc.names
        if method in names:
            return names[method]
        name = None
        try:
            name = self._read_name(proc, method)
        except (OSError, UnicodeDecodeError, struct.error):
            pass
        if len(names) >= _MAX_BLOBS:
            names.clear()
        names[method] = name
        if name is not None and self.remember is not None:
            self.remember(proc.pid, method, name)
        return name

    def _read_name(self, proc: _Process, method: int) -> str | None:
        f, mem, word = proc.f, proc.mem, proc.mem.word
        if not _pointer(method):
            return None
        const = word(method + f["method_const"])
        if not _pointer(const):
            return None
        pool = word(const + f["const_constants"])
        if not _pointer(pool):
            return None
        holder = word(pool + f["pool_holder"])
        if not _pointer(holder) or word(holder + f["klass_constants"]) != pool:
            return None                 # not a class and its pool: not a method
        index = struct.unpack("<H", mem.read(const + f["const_name_index"], 2))[0]
        name = self._symbol(proc, word(pool + f["constant_pool"] + 8 * index))
        klass = self._symbol(proc, word(holder + f["klass_name"]))
        if not name or not klass:
            return None
        return f"{klass.replace('/', '.')}.{name}"

    def _symbol(self, proc: _Process, symbol: int) -> str | None:
        if not _pointer(symbol):
            return None
        f, mem = proc.f, proc.mem
        length = struct.unpack("<H", mem.read(symbol + f["symbol_length"], 2))[0]
        if not 0 < length <= 1024:
            return None
        return mem.read(symbol + f["symbol_body"], length).decode("utf-8")

    def bci(self, proc: _Process, method: int, bcp: int) -> int:
        """The bytecode index of bcp in method, JAVA_NO_BCI where it is not
        in the method's bytecodes."""
        f = proc.f
        try:
            const = proc.mem.word(method + f["method_const"])
            size = struct.unpack("<H", proc.mem.read(const + f["const_code_size"], 2))[0]
        except OSError:
            return JAVA_NO_BCI
        bci = bcp - (const + f["const_method"])
        return bci if 0 <= bci < size else JAVA_NO_BCI


def _pointer(v: int) -> bool:
    return 0x1000 <= v < 1 << 47 and not v & 7
