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
(model.java_frame_word: its Method* and bci); its name is read now
(hotspot_methods.py: checked by what points back; the blob's name must be
"nmethod") and kept by `remember` for the symbols stage. Native code
between Java frames (the VM, JNI) is walked by its CFI (dwarf.py) as any.

A compiled frame's methods inlined at its pc come from the nmethod's
scopes (its PcDescs, then each ScopeDesc's method and bci, caller by
caller), the outermost checked to be the nmethod's own method.

Not thread-safe: the thread that unwinds the deferred stacks calls it all."""
from __future__ import annotations

import bisect
import os
import struct
import time

from ..kernel.procfs import ProcessMemory
from ..model import JAVA_BLOB, JAVA_NO_BCI, java_frame_word
from . import hotspot_methods, hotspot_runtime
from .hotspot_methods import int_reader
from .dwarf import UNMAPPED_NOTE as _UNMAPPED

MAX_PROCS = 256                 # processes whose memory is kept open
NOT_JVM_TTL = 5.0               # seconds a process found running no JVM is believed
# ... of the `java` launcher, which maps libjvm a few ms after its exec: a
# -c java's first copied stacks (offcpu's blocks of its start) came before
LAUNCHER_TTL = 0.05
MAX_JAVA_FRAMES = 1024
_Q = struct.Struct("<Q")
_MAX_BLOBS = 1 << 16            # cached blobs per process before the cache is dropped
_SEGMAP_CHUNK = 256            # segment map bytes read at once
_HEAPS_TTL = 1 << 12            # lookups before a process's code heaps are read again
CUT_NOTE = "stack cut in Java code: no caller found where the frame says"


class _Heap:
    __slots__ = ("low", "high", "segmap", "log2")

    def __init__(self, low, high, segmap, log2):
        self.low, self.high, self.segmap, self.log2 = low, high, segmap, log2


class _Blob:
    """What the walk needs of one CodeBlob; of an nmethod, where its scopes
    are (`key`: what tells it from a later blob at the same address)."""
    __slots__ = ("addr", "end", "kind", "frame_size", "complete", "method", "code",
                 "key", "pcs", "pcs_end", "scopes", "metadata", "name")
    NMETHOD, INTERPRETER, STUB = range(3)

    def __init__(self, addr, code, end, kind, frame_size, complete, method):
        self.addr, self.code, self.end, self.kind = addr, code, end, kind
        self.frame_size, self.complete, self.method = frame_size, complete, method
        self.key = None
        self.name = ""
        self.pcs = self.pcs_end = self.scopes = self.metadata = 0


class _Process:
    __slots__ = ("pid", "f", "mem", "heaps", "low", "high", "names", "strings",
                 "bias", "uses", "header", "pcs", "scopes", "blocks", "code", "formats")

    def __init__(self, pid: int, f: dict, mem: ProcessMemory, bias: int,
                 formats: dict | None = None):
        self.pid, self.f, self.mem, self.bias = pid, f, mem, bias
        self.formats = formats or {}    # an integer field's struct format where not "i"
        self.heaps: list = []
        self.low = self.high = 0
        self.names: dict = {}           # Method* -> name | None
        self.strings: dict = {}         # a blob's _name pointer -> the string
        self.uses = 0
        # bytes of a blob's header read: to the last nmethod field read
        self.header = f["heap_block"] + 8 + max(
            v for k, v in f.items() if k.startswith(("blob_", "nmethod_")))
        self.blocks: dict = {}          # pc -> the start of the block that held it
        self.code: dict = {}            # Method* -> (its bytecodes' address, their size)
        self.pcs: dict = {}             # nmethod key -> its PcDescs [(pc offset, scope offset)]
        self.scopes: dict = {}          # (nmethod key, pc offset) -> [(Method*, bci)]


def _launcher(pid: int) -> bool:
    """Whether pid runs the JDK's `java` launcher (libjvm not mapped yet)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) == "java"
    except OSError:
        return False


class HotSpotLive:
    """The Java frames of copied stacks, per JVM process as each is met.
    `remember(pid, method, name)` is told each method named."""

    def __init__(self, remember=None):
        self.remember = remember
        self._procs: dict = {}          # pid -> _Process, or when it was found no JVM
        self._walked: dict = {}         # pc -> its blob, in the stack being walked
        self.cut = 0                    # stacks cut in Java code (a frame not followed)

    def forget(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if isinstance(proc, _Process):
            proc.mem.close()

    def close(self) -> None:
        for pid in list(self._procs):
            self.forget(pid)

    def process(self, pid: int) -> _Process | None:
        """pid's JVM, or None where it runs none (its maps read once, or
        again after NOT_JVM_TTL s: a pid is reused, a process execs; after
        LAUNCHER_TTL s for the `java` launcher, which maps libjvm soon)."""
        if pid in self._procs:
            proc = self._procs[pid]
            if type(proc) is not float:
                return proc
            if time.monotonic() - proc < NOT_JVM_TTL:
                return None
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
                proc = _Process(pid, layout.as_dict(), mem, bias, layout.int_formats())
        if len(self._procs) >= MAX_PROCS:
            self.forget(next(iter(self._procs)))
        if proc is None:    # believed NOT_JVM_TTL s from now (LAUNCHER_TTL)
            self._procs[pid] = time.monotonic() - (
                NOT_JVM_TTL - LAUNCHER_TTL if _launcher(pid) else 0)
            return None
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
        self._walked.clear()            # blobs are looked up again in each sample
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
            word = step[0]
            words = word if type(word) is tuple else (word,)   # tuple: inlined methods
            addrs.extend(words)
            if sps is not None:
                sps.extend([sp] * len(words))
            ip, sp, bp = step[1:]
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
            word = self._blob_word(proc, blob)
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
        word = self._blob_word(proc, blob)
        if blob.kind == _Blob.NMETHOD and self.method_name(proc, blob.method) is not None:
            word = self._compiled_words(proc, blob, ip, exact)
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

    def _blob_word(self, proc: _Process, blob: _Blob) -> int:
        """The word of a frame in generated code no method is found for:
        its blob, named by the blob's own name ("StubRoutines (1)": the
        call stub that enters Java from the VM)."""
        name = f"[{blob.name}]" if blob.name else "[code cache]"
        if proc.names.get(blob.addr) != name:
            proc.names[blob.addr] = name
            if self.remember is not None:
                self.remember(proc.pid, blob.addr, name)
        return java_frame_word(blob.addr, JAVA_BLOB)

    def _compiled_words(self, proc: _Process, blob: _Blob, ip: int, exact: bool):
        """The Java word of a compiled frame, or a tuple of them (innermost
        first) where methods are inlined at ip: each named, else the
        compiled method's alone."""
        scopes = self.frames_at(proc, blob, ip, exact)
        if not scopes or any(self.method_name(proc, m) is None for m, _bci in scopes):
            return java_frame_word(blob.method)
        last = len(scopes) - 1
        words = tuple(java_frame_word(m, bci, i < last) for i, (m, bci) in enumerate(scopes))
        return words if last else words[0]

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
        if pc in self._walked:
            return self._walked[pc]
        if proc.uses % _HEAPS_TTL == 0 or not proc.heaps:
            self._read_heaps(proc)      # heaps grow (committed memory) as code comes
        proc.uses += 1
        found = None
        if proc.low <= pc < proc.high:
            block = proc.blocks.get(pc)
            if block is not None:       # where the block was: its header read again
                found = self._blob(proc, block, pc, known_name=True)
            if found is None:
                found = self._blob_at(proc, pc)
        self._walked[pc] = found
        return found

    def _blob_at(self, proc: _Process, pc: int) -> _Blob | None:
        for heap in proc.heaps:
            if heap.low <= pc < heap.high:
                break
        else:
            return None
        mem = proc.mem
        index = (pc - heap.low) >> heap.log2
        # each byte: how many segments back the block goes (at most 0xFE a
        # step); 0xFF: free. Read in one go from up to _SEGMAP_CHUNK
        # segments before (a method's blob spans a few dozen)
        first = max(0, index - _SEGMAP_CHUNK + 1)
        chunk = mem.read(heap.segmap + first, index - first + 1)
        for _ in range(64):
            if index < first:
                first = max(0, index - _SEGMAP_CHUNK + 1)
                chunk = mem.read(heap.segmap + first, index - first + 1)
            back = chunk[index - first]
            if back == 0xFF:
                return None
            if back == 0:
                break
            index -= back
        else:
            return None
        block = heap.low + (index << heap.log2)
        found = self._blob(proc, block, pc)
        if found is not None:
            if len(proc.blocks) >= _MAX_BLOBS:
                proc.blocks.clear()
            proc.blocks[pc] = block
        return found

    def _blob(self, proc: _Process, block: int, pc: int,
              known_name: bool = False) -> _Blob | None:
        """The blob of the block at `block` if it holds pc; `known_name`:
        only if its name is one seen before (a block remembered from an
        earlier sample, which may since be inside another's code)."""
        f, mem = proc.f, proc.mem
        # not cached across samples: a freed block is soon another blob
        # (a recompiled method); its header is read each time (one read)
        header = mem.read(block, proc.header)
        if not header[f["block_used"]]:
            return None
        blob = block + f["heap_block"]
        o = f["heap_block"]
        formats = proc.formats

        def get(name):                  # an integer field of the header, of its own width
            return struct.unpack_from("<" + formats.get(name, "i"), header, o + f[name])[0]

        size = get("blob_size")
        if "blob_code_begin" in f:
            code_begin, code_end = struct.unpack_from("<QQ", header, o + f["blob_code_begin"])
        else:
            code_begin, code_end = blob + get("blob_code_offset"), blob + get("blob_data_offset")
        if not code_begin <= pc < code_end or code_end > blob + size:
            return None
        complete = get("blob_frame_complete")
        frame_size = get("blob_frame_size")
        name_ptr = _Q.unpack_from(header, o + f["blob_name"])[0]
        name = proc.strings.get(name_ptr)
        if name is None:
            if known_name:
                return None
            name = proc.strings[name_ptr] = hotspot_runtime.c_string(mem, name_ptr, 64)
        kind = {"nmethod": _Blob.NMETHOD, "Interpreter": _Blob.INTERPRETER}.get(name, _Blob.STUB)
        method = _Q.unpack_from(header, o + f["nmethod_method"])[0] if kind == _Blob.NMETHOD else 0
        found = _Blob(blob, code_begin, code_end, kind, frame_size * 8,
                      code_begin + complete if complete >= 0 else code_begin, method)
        found.name = name
        if kind == _Blob.NMETHOD and "nmethod_immutable" in f:
            # its debug info in a block of its own, metadata after relocations
            found.key = (blob, method, get("nmethod_compile_id"), code_begin)
            debug = _Q.unpack_from(header, o + f["nmethod_immutable"])[0]
            found.pcs = debug + get("nmethod_scopes_pcs")
            found.pcs_end = found.scopes = debug + get("nmethod_scopes_data_offset")
            found.metadata = (_Q.unpack_from(header, o + f["blob_mutable_data"])[0]
                              + get("blob_relocation_size"))
        elif kind == _Blob.NMETHOD and "nmethod_scopes_pcs" in f:
            found.key = (blob, method, get("nmethod_compile_id"), code_begin)
            found.pcs = blob + get("nmethod_scopes_pcs")
            found.pcs_end = blob + get("nmethod_dependencies")
            found.metadata = blob + get("nmethod_metadata")
            at = o + f["nmethod_scopes_data"]
            found.scopes = (_Q.unpack_from(header, at)[0] if at + 8 <= len(header)
                            else mem.word(blob + f["nmethod_scopes_data"]))
        return found

    # --- inlined methods: an nmethod's scopes ------------------------------

    def frames_at(self, proc: _Process, blob: _Blob, pc: int, exact: bool) -> list:
        """[(Method*, bci)] the nmethod's code at pc runs, innermost first
        (the methods inlined there, then the one compiled); [] where its
        scopes say nothing."""
        if blob.key is None:
            return []
        rel = pc - blob.code
        cached = proc.scopes.get((blob.key, rel, exact))
        if cached is not None:
            return cached
        try:
            found = self._scopes_at(proc, blob, rel, exact)
        except (OSError, IndexError, struct.error):
            found = []
        if len(proc.scopes) >= _MAX_BLOBS:
            proc.scopes.clear()
        proc.scopes[(blob.key, rel, exact)] = found
        return found

    def _scopes_at(self, proc: _Process, blob: _Blob, rel: int, exact: bool) -> list:
        f, mem = proc.f, proc.mem
        pcs = proc.pcs.get(blob.key)
        if pcs is None:
            size = f["pc_desc"]
            count = (blob.pcs_end - blob.pcs) // size
            if not 0 < count <= 1 << 16:
                return []
            data = mem.read(blob.pcs, count * size)
            pcs = [struct.unpack_from("<ii", data, i * size + f["pc_offset"])
                   if f["pc_scope"] == f["pc_offset"] + 4 else
                   (struct.unpack_from("<i", data, i * size + f["pc_offset"])[0],
                    struct.unpack_from("<i", data, i * size + f["pc_scope"])[0])
                   for i in range(count)]
            if len(proc.pcs) >= 1024:
                proc.pcs.clear()
            proc.pcs[blob.key] = pcs
        # a call's return address is recorded as is; the return from a leaf
        # call into the VM (no debug info of its own) belongs to the next
        # recorded one (HotSpot's pc_desc_near). A PcDesc marks the END of
        # the code its scope covers: an interrupted pc equal to one's offset
        # is the first instruction of the next scope, not yet run, so it
        # takes the first PcDesc past it (pc_desc_near(pc + 1), as
        # AsyncGetCallTrace and JDK 17's JFR sampler do); 40 % of a C2
        # frame's sampled pcs sit on an offset with -XX:+DebugNonSafepoints
        at = bisect.bisect_left(pcs, (rel + 1 if exact else rel, -1 << 31))
        if at >= len(pcs):
            return []
        offset = pcs[at][1]
        read = int_reader(f)
        out = []
        for _ in range(64):                         # inlining depth bound
            if offset <= 0:                         # serialized null: no scope
                break
            data = mem.read(blob.scopes + offset, 16)
            sender, at = read(data, 0)
            index, at = read(data, at)
            bci, at = read(data, at)
            if index <= 0:
                break
            method = mem.word(blob.metadata + 8 * (index - 1))
            out.append((method, bci + f["entry_bci"]))
            offset = sender
        if not out or out[-1][0] != blob.method:    # not this nmethod's scopes
            return []
        return out

    # --- names -------------------------------------------------------------

    def method_name(self, proc: _Process, method: int) -> str | None:
        """"pkg.Class.method" of a Method*, or None where what it points to
        is not a method's (checked by what points back); its source file
        and line table go to `remember` with it."""
        names = proc.names
        if method in names:
            return names[method]
        found = None
        try:
            found = hotspot_methods.read_method(proc.f, proc.mem, method)
        except (OSError, UnicodeDecodeError, struct.error, IndexError):
            pass
        if len(names) >= _MAX_BLOBS:
            names.clear()
        names[method] = found[0] if found is not None else None
        if found is not None and self.remember is not None:
            self.remember(proc.pid, method, *found)
        return names[method]

    def bci(self, proc: _Process, method: int, bcp: int) -> int:
        """The bytecode index of bcp in method, JAVA_NO_BCI where it is not
        in the method's bytecodes."""
        f = proc.f
        code = proc.code.get(method)
        if code is None:
            try:
                const = proc.mem.word(method + f["method_const"])
                size = struct.unpack("<H", proc.mem.read(const + f["const_code_size"], 2))[0]
            except OSError:
                return JAVA_NO_BCI
            if len(proc.code) >= _MAX_BLOBS:
                proc.code.clear()
            code = proc.code[method] = (const + f["const_method"], size)
        bci = bcp - code[0]
        return bci if 0 <= bci < code[1] else JAVA_NO_BCI

