"""Names of CPython code objects (3.8-3.13, x86-64), read from the memory
of the live process: qualified name, file, first line and line table.

A Python frame in a stack is (code object, code-unit index)
(model.python_frame_parts): the code object by its address (the copy
path's user-space walk) or by an id the in-kernel walk gave it (bpf/
python.h: an address is reused by the code objects a program makes and
frees, an id is not). The code object lives only as long as its process,
so it is read when the capture first sees it (`remember`, checking an
id's object is still the one it stands for) and named at the end
(`frame`), when the process may be gone. Offsets below
are the release builds' (tests/test_python_code.py checks them against
each build's DWARF and 3.13's _Py_DebugOffsets)."""
from __future__ import annotations

import os
import struct
import threading
from collections import OrderedDict

from ..kernel.procfs import ProcessMemory, started
from ..model import PYTHON_INDEX_MAX, Frame, PythonCodeInfo, printable
from ..unwind.python_runtime import CODE_OFFSETS

from ..unwind.python_frames import ascii_data, code_identity, freed

# an id's word (bpf/python.h): PY_CUT, the frames left out of a deep
# stack (its index their count; 0: C frames the native walk did not reach,
# the Python chain going on after them); PY_NOT_READ, a code object the
# kernel could not check
PY_CUT, PY_NOT_READ = 0, 1
NOT_READ = "[python code, not read]"
C_FRAMES_CUT = "[C frames left out: the stack is deeper than the in-kernel walk goes]"
TYPE_NAME = 24                 # PyTypeObject.tp_name

MAX_CODES = 1 << 16            # code objects kept (all processes); bounds memory
MAX_KEPT_BYTES = 64 << 20      # and their names' and line tables' bytes
MAX_TEXT = 4096                # characters of a name or file read at most
MAX_TABLE = 1 << 18            # bytes of a line table read at most
_FRAMES_KEPT = 1 << 16         # (pid, code, index) -> Frame memo


# which line table the code object has (see line_of)
LNOTAB, LINETABLE_310, LOCATIONS = "lnotab", "linetable", "locations"
NO_TABLE = "none"          # named from what the kernel copied: its first line only
TABLE_KIND = {(3, 8): LNOTAB, (3, 9): LNOTAB, (3, 10): LINETABLE_310,
              (3, 11): LOCATIONS, (3, 12): LOCATIONS, (3, 13): LOCATIONS}

# sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject): a compact string's
# characters follow the one or the other (3.12 dropped the wstr fields)
UNICODE_HEADERS = {v: (ascii_data(v), 72 if v <= (3, 11) else 56) for v in CODE_OFFSETS}
UNICODE_LENGTH, UNICODE_STATE = 16, 32
BYTES_SIZE, BYTES_DATA = 16, 32            # PyBytesObject's ob_size, ob_sval
_ENCODINGS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}
_U64 = struct.Struct("<Q")


class PythonCode:
    """Names of the code objects of Python processes, read once. The copy
    path's capture remembers them on its drain thread (capture/perf.py)
    while stacks are named: what changes the memo holds the lock."""

    def __init__(self, live: bool = True):
        self._lock = threading.RLock()
        self.live = live           # pids are this host's processes (not a recording's)
        self._codes: OrderedDict = OrderedDict()   # (pid, code) -> PythonCodeInfo
        self._bytes = 0                            # what _codes' entries hold
        self._versions: dict = {}                  # pid -> (major, minor)
        self._frames: dict = {}
        # (name, file, line) -> its Frame: one Frame for a line of code in
        # every process running it (a program started again and again), so
        # that a sink knows it by identity without reading it
        self._alike: dict = {}
        self._no_code: set = set()     # (pid, code): read while its process lived, no code object there
        self._unvouched: dict = {}     # (pid, id) -> a freed code object's read, awaiting the kernel's copy
        self.by_id = False         # frames name code objects by the kernel's ids, not addresses
        self.unnamed = 0           # frames shown as a placeholder: their process had ended
        self.not_code = 0          # and those whose address held no code object
        self.not_read = 0          # frames whose code object could not be checked
        self.first_lines = 0       # code objects named from the kernel's copy
        self.cut = 0               # stacks with Python frames left out in the middle
        self.deepest = 0           # the most merged frames one of them had

    @property
    def warnings(self) -> list:
        said = []
        if self.not_read:
            said.append(f"{self.not_read} Python frames are shown as {NOT_READ}: their "
                        "code object could not be read and checked while it was the one "
                        "that ran (freed, or the frame is damaged)")
        if self.first_lines:
            said.append(f"{self.first_lines} Python functions were gone before their line "
                        "table could be read: their frames show the function's first line")
        if self.cut:
            said.append(f"{self.cut} stacks deeper than ustack keeps show their innermost "
                        "and outermost frames and, between them, how many were left out "
                        f"(at most {self.deepest})")
        if self.not_code:
            said.append(f"{self.not_code} Python frames are shown as [python code 0x...]: "
                        "their process was running, but no code object was at their "
                        "address (freed, or the frame is damaged)")
        if not self.unnamed:
            return said
        if not self.live:
            return said + [f"{self.unnamed} Python frames are shown as [python code 0x...]: "
                           "the recording does not name their code object"]
        return said + [f"{self.unnamed} Python frames are shown as [python code 0x...]: "
                       "their process ended before ustack could read their code object"]

    def remember(self, pid: int, code: int, version: tuple, code_id: int | None = None,
                 identity: int = 0, copied: tuple | None = None) -> None:
        """Read the code object at `code` in pid now, again if it was read
        before (another code object may have been made there). With
        `code_id` (the in-kernel walk's), it is kept under that id, and
        only if what is read has the `identity` the kernel saw (bpf/
        python.h code_identity) and is a code object: else the id's
        frames are shown as not read, never named after another code
        object; then `copied`, (name, file, first line) the kernel read
        at the sample names it (no line table: its frames show its first line).
        One that cannot be read (the process is gone, the address holds no
        code object of that version) is left to frame(), which reads again
        or says so: the capture calling this must go on either way."""
        with self._lock:
            if code_id is None:     # the copy path: by address
                self._remember(pid, code, version)
            else:
                self.by_id = True
                self._remember_id(pid, code, tuple(version[:2]), code_id, identity, copied)

    def _remember_id(self, pid: int, code: int, version: tuple, code_id: int,
                     identity: int, copied: tuple | None) -> None:
        vouched = bool(copied and copied[0] and copied[1])
        try:
            info = read_code(pid, code, version, identity)
        except (OSError, ValueError, OverflowError):
            info = None
        if info is not None and (not copied or _agrees(info, copied)):
            self._add(pid, code_id << 3, info)  # as model.python_frame_parts gives it
            return
        # Freed (a short command's code objects, read at its exit; the
        # allocator has written over its head), its fields may still be
        # there: read unchecked, used only where the kernel's copy at the
        # sample vouches for what it names; read without one, it waits
        if not vouched:
            try:
                unchecked = read_code(pid, code, version)
            except (OSError, ValueError, OverflowError):
                return              # frame() says not read
            if len(self._unvouched) >= MAX_CODES:
                self._unvouched.clear()
            self._unvouched[(pid, code_id)] = unchecked
            return
        info = self._unvouched.pop((pid, code_id), None)
        if info is None:
            try:
                info = read_code(pid, code, version)
            except (OSError, ValueError, OverflowError):
                info = None
        if info is None or not _agrees(info, copied):
            name, file, first = copied
            info = PythonCodeInfo(name=printable(name), file=printable(file),
                                  firstlineno=first, table_kind=NO_TABLE, table=b"")
            self.first_lines += 1
        self._add(pid, code_id << 3, info)

    def _remember(self, pid: int, code: int, version: tuple) -> None:
        if len(self._versions) >= MAX_CODES:
            self._versions.clear()
        self._versions[pid] = tuple(version[:2])
        try:
            info = read_code(pid, code, tuple(version[:2]))
        except (OSError, ValueError, OverflowError):
            # told apart now, while it may still run: a live process whose
            # frame names garbage is not one that ended
            if started(pid) is not None:
                if len(self._no_code) >= MAX_CODES:
                    self._no_code.clear()
                self._no_code.add((pid, code))
            return
        if self._codes.get((pid, code)) != info:
            if (pid, code) in self._codes:
                self._frames.clear()        # frames named after the code it replaces
            self._add(pid, code, info)

    def known(self, pid: int, code: int) -> bool:
        """Whether the code object at `code` in pid was read already."""
        return (pid, code) in self._codes

    def add(self, pid: int, code: int, info: PythonCodeInfo) -> None:
        """Keep what names a code object (read here, or from a recording)."""
        with self._lock:
            self._add(pid, code, info)

    def _add(self, pid: int, code: int, info: PythonCodeInfo) -> None:
        codes = self._codes
        old = codes.pop((pid, code), None)
        if old is not None:
            self._bytes -= _size(old)
        codes[(pid, code)] = info
        self._bytes += _size(info)
        while len(codes) > MAX_CODES or self._bytes > MAX_KEPT_BYTES:
            self._bytes -= _size(codes.popitem(last=False)[1])   # the least recently used

    def info(self, pid: int, code: int) -> PythonCodeInfo | None:
        """The PythonCodeInfo of a code object, read now when never remembered
        and its process lives; None when it cannot be had."""
        with self._lock:
            return self._info(pid, code)

    def _info(self, pid: int, code: int) -> PythonCodeInfo | None:
        info = self._codes.get((pid, code))
        if info is not None:
            self._codes.move_to_end((pid, code))
            return info
        if not self.live or self.by_id:
            return None             # an id is no address to read at
        version = self._versions.get(pid) or _version_of(pid)
        if version is None:
            return None
        self._remember(pid, code, version)
        return self._codes.get((pid, code))

    def frame(self, pid: int, code: int, index: int) -> Frame:
        key = (pid, code, index)
        found = self._frames.get(key)
        if found is not None:
            return found
        if self.by_id and code == PY_CUT << 3 and index == 0:
            return Frame(addr=0, module="", kind="python", function=C_FRAMES_CUT)
        if self.by_id and code == PY_CUT << 3:
            self.cut += 1
            self.deepest = max(self.deepest, index)
            return Frame(addr=0, module="", kind="python",
                         function=f"[{index} frames left out: the stack is deeper than ustack keeps]")
        info = self.info(pid, code)
        if info is None and self.by_id:
            self.not_read += 1
            return Frame(addr=0, module="", function=NOT_READ, kind="python")
        if info is None:
            if (pid, code) in self._no_code:
                self.not_code += 1
            else:
                self.unnamed += 1
            return Frame(addr=0, module="", function=f"[python code {code:#x}]",
                         kind="python")
        line = line_of(info, index)
        frame = self._alike.get((info.name, info.file, line))
        if frame is None:
            frame = Frame(addr=0, module=os.path.basename(info.file), function=info.name,
                          file=info.file, line=line, kind="python")
            if len(self._alike) >= _FRAMES_KEPT:
                self._alike.clear()
            self._alike[(info.name, info.file, line)] = frame
        if len(self._frames) >= _FRAMES_KEPT:
            self._frames.clear()
        self._frames[key] = frame
        return frame


def _agrees(info: PythonCodeInfo, copied: tuple) -> bool:
    """Whether what was read of a code object names it as the kernel's
    copy at the sample does (a name or file it cut ends or starts with
    "…"; one it could not copy, "", agrees with anything)."""
    name, file, first = copied
    if first != info.firstlineno:
        return False
    if name and (info.name[:len(name) - 1] != printable(name[:-1]) if name.endswith("…")
                 else info.name != printable(name)):
        return False
    if file and (not info.file.endswith(printable(file[1:])) if file.startswith("…")
                 else info.file != printable(file)):
        return False
    return True


def _size(info: PythonCodeInfo) -> int:
    return len(info.table) + len(info.name) + len(info.file) + 200   # + the objects' own


def _version_of(pid: int) -> tuple | None:
    """The CPython version a process runs, from its mappings."""
    from ..kernel import procfs
    from ..unwind.python_runtime import find_interpreter
    try:
        interp = find_interpreter(procfs.executable_mappings(pid))
    except (OSError, ValueError):
        return None
    return interp.version if interp is not None else None


# -- reading a process's objects ---------------------------------------------

def read_code(pid: int, code: int, version: tuple, identity: int = 0) -> PythonCodeInfo:
    """The code object at `code` in pid; with `identity`, only if it has
    that identity before and after it is read, its type is named "code"
    and it is not freed (ValueError otherwise)."""
    offsets = CODE_OFFSETS.get(version)
    if offsets is None:
        raise ValueError(f"no code object layout for Python {version[0]}.{version[1]}")
    mem = ProcessMemory(pid)
    try:
        header = mem.read(code, 144)
        if identity and (code_identity(header, offsets) != identity or freed(header, code)
                         or mem.read(mem.word(_U64.unpack_from(header, 8)[0] + TYPE_NAME), 5)
                         != b"code\0"):
            raise ValueError(f"the code object at {code:#x} is not the one that ran")
        ptr = lambda name: struct.unpack_from("<Q", header, offsets[name])[0]  # noqa: E731
        name_field = "qualname" if offsets["qualname"] is not None else "name"
        firstlineno = struct.unpack_from("<i", header, offsets["firstlineno"])[0]
        # a program names its own code: nothing it chose may drive a terminal
        info = PythonCodeInfo(name=printable(read_str(mem, ptr(name_field), version)),
                              file=printable(read_str(mem, ptr("filename"), version)),
                              firstlineno=firstlineno, table_kind=TABLE_KIND[version],
                              table=read_bytes(mem, ptr("table")))
        again = mem.read(code, 144)
        if identity and (code_identity(again, offsets) != identity or freed(again, code)):
            raise ValueError(f"the code object at {code:#x} changed while it was read")
        return info
    finally:
        mem.close()



def read_str(mem: ProcessMemory, addr: int, version: tuple) -> str:
    """A str object's text: compact ASCII, compact latin-1/UCS-2/UCS-4, or
    (rare for names) a legacy string whose characters are elsewhere."""
    ascii_size, compact_size = UNICODE_HEADERS[version]
    head = mem.read(addr, compact_size + 8)
    length = struct.unpack_from("<q", head, UNICODE_LENGTH)[0]
    state = struct.unpack_from("<I", head, UNICODE_STATE)[0]
    kind, compact, is_ascii = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not 0 <= length <= MAX_TEXT or kind not in _ENCODINGS:
        raise ValueError(f"no str object at {addr:#x}")
    if compact:
        data = addr + (ascii_size if is_ascii else compact_size)
    else:
        data = struct.unpack_from("<Q", head, compact_size)[0]
    raw = mem.read(data, length * kind) if length else b""
    return raw.decode("ascii" if is_ascii else _ENCODINGS[kind], "replace")


def read_bytes(mem: ProcessMemory, addr: int) -> bytes:
    size = struct.unpack("<q", mem.read(addr + BYTES_SIZE, 8))[0]
    if not 0 <= size <= MAX_TABLE:
        raise ValueError(f"no bytes object at {addr:#x}")
    return mem.read(addr + BYTES_DATA, size) if size else b""


# -- line tables ---------------------------------------------------------------

def line_of(info: PythonCodeInfo, index: int) -> int:
    """The line of the instruction at code unit `index` (0: none known).
    An index the table does not reach (a frame not started yet, an index
    clamped at PYTHON_INDEX_MAX) gives the function's first line, as a
    traceback does for a frame before its first instruction."""
    if index >= PYTHON_INDEX_MAX or info.table_kind == NO_TABLE:
        return _a_line(info.firstlineno)
    try:
        if info.table_kind == LOCATIONS:
            line = _line_from_locations(info.table, info.firstlineno, index)
        elif info.table_kind == LINETABLE_310:
            line = _line_from_linetable(info.table, info.firstlineno, 2 * index)
        else:
            line = _line_from_lnotab(info.table, info.firstlineno, 2 * index)
    except IndexError:                        # a table cut short
        line = None
    return _a_line(info.firstlineno if line is None else line)


def _a_line(line: int) -> int:
    """`line`, or 0 when it cannot be one (CPython's lines are C ints from
    1): a code object freed and reused under a running frame reads as
    garbage, -230203915 or 10**23, which pprof's int64 and ClickHouse's
    UInt32 refuse (a whole-machine `profile --every -o DIR/` failed so)."""
    return line if 0 < line < 1 << 31 else 0


def _line_from_lnotab(table: bytes, line: int, offset: int) -> int:
    """3.8/3.9 co_lnotab: (byte offset increment, signed line increment)
    pairs; the line of byte `offset` (PyCode_Addr2Line)."""
    addr = 0
    for i in range(0, len(table) - 1, 2):
        addr += table[i]
        if addr > offset:
            break
        delta = table[i + 1]
        line += delta - 256 if delta >= 128 else delta
    return line


def _line_from_linetable(table: bytes, line: int, offset: int) -> int | None:
    """3.10 co_linetable: (byte length, signed line delta or -128: none)
    entries, each a range starting where the last ended."""
    end = 0
    for i in range(0, len(table) - 1, 2):
        start, end = end, end + table[i]
        delta = table[i + 1]
        if delta == 128:
            current = None
        else:
            line += delta - 256 if delta > 128 else delta
            current = line
        if start <= offset < end:
            return current
    return None


def _line_from_locations(table: bytes, line: int, index: int) -> int | None:
    """3.11+ location table (Objects/locations.md): entries of 1-8 code
    units, each starting with a byte 1CCCCLLL (code, length - 1); the line
    of the entry holding code unit `index`."""
    at, unit, n = 0, 0, len(table)
    while at < n:
        first = table[at]
        code, length = (first >> 3) & 15, (first & 7) + 1
        at += 1
        current = line
        if code == 15:                        # no location
            current = None
        elif code == 14:                      # long form: line delta, end, columns
            delta, at = _svarint(table, at)
            line += delta
            current = line
            for _ in range(3):
                _, at = _varint(table, at)
        elif code == 13:                      # no column
            delta, at = _svarint(table, at)
            line += delta
            current = line
        elif code >= 10:                      # one line: delta code - 10, 2 columns
            line += code - 10
            current = line
            at += 2
        else:                                 # short form: same line, 1 byte
            at += 1
        if unit <= index < unit + length:
            return current
        unit += length
    return None


def _varint(table: bytes, at: int) -> tuple:
    value, shift = 0, 0
    while True:
        b = table[at]
        at += 1
        value |= (b & 63) << shift
        shift += 6
        if not b & 64:
            return value, at


def _svarint(table: bytes, at: int) -> tuple:
    value, at = _varint(table, at)
    return (-(value >> 1) if value & 1 else value >> 1), at
