"""A Perl thread's frames read from its live process, for the stacks ustack
unwinds itself (script_live.py): what bpf/perl.h reads in the kernel, in
user space, with the layout of unwind/perl_runtime.py.

The interpreter: the kernel takes a thread's own from its pthread keys
(at its fsbase, which user space does not see). Here the main thread's is
PL_curinterp (the process's first interpreter); another ithread's is its
PL_thr_key value in its struct pthread, which glibc puts at the top of the
thread's stack mapping: found there by what only a struct pthread holds
(its tcbhead's tcb and self words point at it, its tid is the thread's),
once per thread (perl_threads.py).

Its context stack as perl.h reads it: PL_curstackinfo's contexts,
innermost first, then each si_prev's; a run loop's native frame stands for
one stackinfo's frames (a sub's context names its CV, its line is the COP
its callee saved, the innermost's PL_curcop; the main program's body ends
the outermost). Each sub met is named (name, package, file) into the
run's PerlSubs (symbols/perl.py) unless it was with the same identity
(its GV or name HEK), as the kernel copies it into PERL_SUBS."""
from __future__ import annotations

import struct

from ..kernel.procfs import ProcessMemory
from ..model import perl_frame_word
from . import perl_runtime
from .perl_threads import ThreadBlocks
from .script_live import ScriptRuntime

MAX_CONTEXTS = 2048             # perl.h's PERL_MAX_CONTEXTS
MAX_SUBS = 1 << 14              # subs remembered per process (then named anew)
MAX_TEXT = 256                  # bytes of a name or file read at most
CXT_TYPE_MASK, CXT_SUB, CXT_EVAL = 0xF, 9, 11
CXP_EVALBLOCK = 0x40
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")


class _Process:
    __slots__ = ("mem", "f", "curinterp_at", "thr_key_at", "threads", "subs", "fresh")

    def __init__(self, mem: ProcessMemory, f: dict, curinterp_at: int, thr_key_at: int,
                 pid: int):
        self.mem, self.f, self.curinterp_at = mem, f, curinterp_at
        self.thr_key_at = thr_key_at
        self.threads = ThreadBlocks(pid, mem)   # tid -> its struct pthread
        self.subs: dict = {}            # cv -> identity, of the subs named
        self.fresh: dict = {}           # subs met, not named yet: cv -> (cop, main cv)


class PerlLive(ScriptRuntime):
    """`subs`: the run's PerlSubs, which names the frames read."""

    def __init__(self, subs):
        self.subs = subs

    def detect(self, path: str):
        return perl_runtime.object_interpreter(path)

    def vm_range(self, interp) -> tuple:
        return interp.run_loop

    def open(self, pid: int, interp, bias: int, mem: ProcessMemory):
        return _Process(mem, dict(interp.layout), bias + interp.curinterp,
                        bias + interp.thr_key, pid)

    def _interpreter(self, proc: _Process, pid: int, tid: int) -> int:
        """The thread's PerlInterpreter (0: none known): the main thread's
        is PL_curinterp; another's, its PL_thr_key value, as perl.h reads
        it (the first 32 keys' values are in the struct pthread)."""
        if tid == pid:
            return proc.mem.word(proc.curinterp_at)
        block = proc.threads.of(tid)
        if block is None:
            return 0
        key = _U32.unpack(proc.mem.read(proc.thr_key_at, 4))[0]
        if key >= perl_runtime.PTHREAD_KEYS_1ST:
            return 0
        return proc.mem.word(block + proc.f["pthread_specific"] + 16 * key + 8)

    def read(self, proc: _Process, pid: int, tid: int) -> list | None:
        mem, f = proc.mem, proc.f
        interp = self._interpreter(proc, pid, tid)
        if not interp:
            return None
        si = mem.word(interp + f["interp_curstackinfo"])
        cop = mem.word(interp + f["interp_curcop"])
        main_cv = mem.word(interp + f["interp_main_cv"])
        if not si or not main_cv:
            return None
        size = f["cx_size"]
        groups: list = []
        contexts = 0
        while si:
            frames: list = []
            ix = _I32.unpack(mem.read(si + f["si_cxix"], 4))[0]
            cxstack = mem.word(si + f["si_cxstack"])
            if ix >= 0:
                contexts += ix + 1
                if contexts > MAX_CONTEXTS or not cxstack:
                    break
                raw = mem.read(cxstack, (ix + 1) * size)
            for i in range(ix, -1, -1):
                cx = raw[i * size:(i + 1) * size]
                kind = cx[0] & CXT_TYPE_MASK
                if kind == CXT_SUB:
                    cv = _U64.unpack_from(cx, f["cx_sub_cv"])[0]
                    if cv:              # 0: pp_entersub pushed the block, not the sub yet
                        frames.append(self._frame(proc, cv, cop, main_cv))
                    cop = _U64.unpack_from(cx, f["cx_oldcop"])[0]
                elif kind == CXT_EVAL and not cx[0] & CXP_EVALBLOCK:
                    cop = _U64.unpack_from(cx, f["cx_oldcop"])[0]     # where it was required
            si = mem.word(si + f["si_prev"])
            if not si:                  # the main program's body ends the outermost
                frames.append(self._frame(proc, main_cv, cop, main_cv))
            groups.append(tuple(frames))
        return groups

    def named(self, proc: _Process, pid: int) -> None:
        for cv, (cop, main_cv) in proc.fresh.items():
            try:
                identity, name, package, file = _names(proc, cv, cop, main_cv)
            except (OSError, UnicodeDecodeError, struct.error):
                continue
            if identity is None:
                continue
            if len(proc.subs) >= MAX_SUBS:
                proc.subs.clear()
            proc.subs[cv] = identity
            if self.subs is not None:
                self.subs.remember(pid, cv, name, package, file)
        proc.fresh = {}

    def _frame(self, proc: _Process, cv: int, cop: int, main_cv: int) -> int:
        line = _U32.unpack(proc.mem.read(cop + proc.f["cop_line"], 4))[0] if cop else 0
        if cv not in proc.fresh:
            known = proc.subs.get(cv)
            # named already, with the same identity (the main body's is 0)
            if known is None or (cv != main_cv and known != _identity(proc, cv)):
                proc.fresh[cv] = (cop, main_cv)
        return perl_frame_word(cv, line)


def _identity(proc: _Process, cv: int) -> int:
    """What tells the sub at cv from another made there later: its GV
    (or name HEK), as perl.h keys PERL_SUBS."""
    body = proc.mem.word(cv)
    return proc.mem.word(body + proc.f["cv_gv"]) if body else 0


def _names(proc: _Process, cv: int, cop: int, main_cv: int) -> tuple:
    """(identity, name, package, file) of the sub at cv (perl.h's
    perl_seen): the main program's body has no name and its COP's file."""
    mem, f = proc.mem, proc.f
    if cv == main_cv:
        file = _cstring(mem, mem.word(cop + f["cop_file"])) if cop else ""
        return 0, "", "", file
    body = mem.word(cv)
    if not body:
        return None, "", "", ""
    identity = mem.word(body + f["cv_gv"])
    if not identity:
        return None, "", "", ""
    flags = _U32.unpack(mem.read(body + f["cv_flags"], 4))[0]
    if flags & f["cv_named"]:
        name_hek, stash = identity, mem.word(body + f["cv_stash"])
    else:
        gv_body = mem.word(identity)
        name_hek = mem.word(gv_body + f["gv_name"]) if gv_body else 0
        stash = mem.word(gv_body + f["gv_stash"]) if gv_body else 0
    return (identity, _hek(proc, name_hek), _stash_name(proc, stash),
            _cstring(mem, mem.word(body + f["cv_file"])))


def _hek(proc: _Process, hek: int) -> str:
    """The key of the HEK at hek ("" for none): hek_len, an I32, is the
    word before hek_key."""
    if not hek:
        return ""
    key = hek + proc.f["hek_key"]
    n = _I32.unpack(proc.mem.read(key - 4, 4))[0]
    if n <= 0:
        return ""
    return proc.mem.read(key, min(n, MAX_TEXT)).decode("utf-8", "replace")


def _stash_name(proc: _Process, hv: int) -> str:
    """The package name of the stash at hv ("" where it has none)."""
    mem, f = proc.mem, proc.f
    if not hv or not _U32.unpack(mem.read(hv + f["sv_flags"], 4))[0] & f["sv_ook"]:
        return ""
    body = mem.word(hv)
    if not body:
        return ""
    aux = body + f["hv_aux"]
    name = mem.word(aux + f["aux_name"])
    if _I32.unpack(mem.read(aux + f["aux_name_count"], 4))[0] and name:
        name = mem.word(name)           # several names: the first is the effective one
    return _hek(proc, name)


def _cstring(mem: ProcessMemory, at: int) -> str:
    """The NUL-ended string at `at`, its first MAX_TEXT bytes at most."""
    if not at:
        return ""
    for size in (MAX_TEXT, 64, 16):     # a string near the end of its mapping: shorter reads
        try:
            raw = mem.read(at, size)
        except OSError:
            continue
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")
    return ""
