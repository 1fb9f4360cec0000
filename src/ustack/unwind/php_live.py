"""A PHP thread's frames read from its live process, for the stacks ustack
unwinds itself (script_live.py): what bpf/php.h reads in the kernel, in
user space, with the layout of unwind/php_runtime.py.

executor_globals.current_execute_data starts the chain (an NTS build: one
per process, so the thread is the process's); each zend_execute_data's
function, opline (its line) and prev_execute_data; an execute_ex call's
group ends at the frame flagged ZEND_CALL_TOP. A frame's word names its
function by an id, as the kernel's do (model.php_frame_parts): ids made
here end in USER_CPU, a CPU number the kernel's ids never end in (php.h
takes the CPU modulo 4095), and their names go to the run's PhpFunctions
(symbols/php.py) when first met; a function whose identity (type, name,
class, file, first line) changed at its address gets a new id."""
from __future__ import annotations

import struct

from ..kernel.procfs import ProcessMemory
from ..model import PHP_FRAME_TAG, PHP_LINE_MAX
from . import php_runtime
from .script_live import ScriptRuntime

ID_CPU_BITS = 12                # php.h's PHP_ID_CPU_BITS
USER_CPU = 4095                 # the low bits of an id made in user space
ID_MASK = (1 << 44) - 1
MAX_FRAMES = 1024               # frames read at most (php.h's PHP_MAX_WORDS)
MAX_FUNCTIONS = 1 << 14         # functions remembered per process (then read anew)
MAX_TEXT = 4096                 # bytes of a name read at most
ED_READ = 64                    # php.h's PHP_ED_READ
FN_READ = 32                    # php.h's PHP_FN_READ
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class _Process:
    __slots__ = ("mem", "f", "current_at", "functions", "fresh", "in_c")

    def __init__(self, mem: ProcessMemory, f: dict, current_at: int):
        self.mem, self.f, self.current_at = mem, f, current_at
        self.functions: dict = {}       # zend_function address -> (identity, id)
        self.fresh: list = []           # ids not named yet: (id, type, func, head)
        self.in_c = False               # the last read's innermost frame is a builtin's


class PhpLive(ScriptRuntime):
    """`functions`: the run's PhpFunctions, which names the frames read."""

    def __init__(self, functions):
        self.functions = functions
        self._ids = 0

    def detect(self, path: str):
        return php_runtime.object_interpreter(path)

    def vm_range(self, interp) -> tuple:
        return interp.execute_range

    def open(self, pid: int, interp, bias: int, mem: ProcessMemory):
        f = dict(interp.layout)
        return _Process(mem, f, bias + interp.executor_globals + f["eg_current_execute_data"])

    def read(self, proc: _Process, pid: int, tid: int) -> list | None:
        mem, f = proc.mem, proc.f
        ed = mem.word(proc.current_at)
        if not ed:
            return None
        groups: list = []
        group: list = []
        proc.in_c = False
        for i in range(MAX_FRAMES):
            head = mem.read(ed, ED_READ)
            info = _U32.unpack_from(head, f["ed_call_info"])[0]
            func = _U64.unpack_from(head, f["ed_func"])[0]
            if func:
                group.append(self._word(proc, func, _U64.unpack_from(head, f["ed_opline"])[0]))
                if i == 0:
                    proc.in_c = proc.mem.read(func, 1)[0] != f["user_function"]
            if info & f["call_top"]:
                groups.append(tuple(group))
                group = []
            ed = _U64.unpack_from(head, f["ed_prev"])[0]
            if not ed:
                break
        if group:
            groups.append(tuple(group))
        return groups

    def agrees(self, proc: _Process, innermost: int) -> bool:
        # the sample's pc in execute_ex (the hybrid VM runs PHP code there)
        # where the read finds a builtin running
        return not (proc.in_c and innermost == 0)

    def named(self, proc: _Process, pid: int) -> None:
        for function_id, kind, func, fn in proc.fresh:
            try:
                name, scope, path = _names(proc, kind, func, fn)
            except (OSError, UnicodeDecodeError, struct.error):
                name, scope, path = "", "", ""
            if self.functions is not None:
                self.functions.remember_read(pid, function_id, kind, name, scope, path)
        proc.fresh = []

    def _word(self, proc: _Process, func: int, opline: int) -> int:
        """The frame's word: its function's id and the line of its opline."""
        mem, f = proc.mem, proc.f
        fn = mem.read(func, FN_READ)
        kind = fn[0]
        filename = line_start = line = 0
        if kind == f["user_function"]:
            filename = mem.word(func + f["fn_filename"])
            line_start = _U32.unpack(mem.read(func + f["fn_line_start"], 4))[0]
            if opline:
                line = _U32.unpack(mem.read(opline + f["op_lineno"], 4))[0]
        identity = (kind, _U64.unpack_from(fn, f["fn_name"])[0],
                    _U64.unpack_from(fn, f["fn_scope"])[0], filename, line_start)
        known = proc.functions.get(func)
        if known is None or known[0] != identity:
            if len(proc.functions) >= MAX_FUNCTIONS:
                proc.functions.clear()
            self._ids += 1
            known = proc.functions[func] = (
                identity, (self._ids << ID_CPU_BITS | USER_CPU) & ID_MASK)
            proc.fresh.append((known[1], kind, func, fn))
        return PHP_FRAME_TAG | known[1] << 16 | min(line, PHP_LINE_MAX)


def _names(proc: _Process, kind: int, func: int, fn: bytes) -> tuple:
    """(name, class, file) of the zend_function at func (its head fn)."""
    mem, f = proc.mem, proc.f
    name = _string(proc, _U64.unpack_from(fn, f["fn_name"])[0])
    scope_at = _U64.unpack_from(fn, f["fn_scope"])[0]
    scope = _string(proc, mem.word(scope_at + f["ce_name"])) if scope_at else ""
    path = _string(proc, mem.word(func + f["fn_filename"])) \
        if kind == f["user_function"] else ""
    return name, scope, path


def _string(proc: _Process, at: int) -> str:
    """The characters of the zend_string at `at` ("" for none)."""
    if not at:
        return ""
    n = proc.mem.word(at + proc.f["str_len"])
    if not n:
        return ""
    return proc.mem.read(at + proc.f["str_val"], min(n, MAX_TEXT)).decode("utf-8", "replace")
