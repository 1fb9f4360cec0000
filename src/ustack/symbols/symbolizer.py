"""Runtime addresses -> Frames: each address is normalized to (mapping,
object file, file offset), then named by its source: ELF symbols and debug
files (elf_source.py), Go's pclntab (go.py), a JIT's perf map (perfmap.py), the
vDSO (vdso_source.py); kernel addresses by kallsyms (kernel.py). A Python
frame's tagged word (model.python_frame_parts) is named by the run's
PythonCode (python.py), a JS frame's (model.v8_frame_parts) by V8Functions
(v8.py), a PHP frame's (model.php_frame_parts) by PhpFunctions (php.py), a
Perl frame's (model.perl_frame_parts) by PerlSubs (perl.py), a Ruby frame's
(model.ruby_frame_parts) by RubyIseqs (ruby.py)."""
from __future__ import annotations

import os

from ..model import (LOWEST_FRAME_TAG, PERL_FRAME_TAG, PHP_FRAME_TAG, PYTHON_FRAME_TAG,  # noqa: F401 (SymbolOptions: its old home)
                     JAVA_FRAME_TAG, RUBY_FRAME_TAG, V8_FRAME_TAG, Frame, SymbolOptions,
                     java_frame_parts, perl_frame_parts,
                     php_frame_parts, printable, python_frame_parts, ruby_frame_parts,
                     v8_frame_parts)
from ..objfile.demangle import demangle
from ..unwind.restore_rt import RESTORE_RT
from .elf_source import ElfSource
from .normalize import normalize
from .runtime_names import RuntimeNames
from .vdso_source import VDSO_MODULE, is_vdso, unnamed_frame

_PYTHON_TAG = PYTHON_FRAME_TAG >> 60
_V8_TAG = V8_FRAME_TAG >> 60
_PHP_TAG = PHP_FRAME_TAG >> 60
_PERL_TAG = PERL_FRAME_TAG >> 60
_RUBY_TAG = RUBY_FRAME_TAG >> 60
_JAVA_TAG = JAVA_FRAME_TAG >> 60
_LOWEST_TAG = LOWEST_FRAME_TAG >> 60
_MAX_MODULES = 1 << 12   # distinct mapped paths whose module name is kept
_MAX_PLACES = 1 << 16    # places in mapped files whose frames are kept


class Symbolizer:
    """`mappings` is anything with find(pid, addr) -> Mapping | None (and,
    optionally, paths(pid): the files a process maps). `warnings` is what
    the user should hear once (debug files refused, corrupt DWARF, JIT code
    without a perf map), one sentence each."""

    def __init__(self, mappings, options: SymbolOptions = SymbolOptions(),
                 python_code=None, v8_functions=None, php_functions=None, perl_subs=None,
                 ruby_iseqs=None, names: RuntimeNames | None = None):
        """The runtimes' names tables: the run's `names` (RuntimeNames),
        else those given (PythonCode, V8Functions, ...), the rest made at
        their first use."""
        self.mappings = mappings
        self.options = options
        self._said: list = []
        name = _demangled_printable if options.demangle else printable
        self._elf = ElfSource(options, name, self._said)
        self._go_symbols = None           # Go's names: made at the first unnamed address
        if names is None:
            given = (("python", python_code), ("js", v8_functions), ("php", php_functions),
                     ("perl", perl_subs), ("ruby", ruby_iseqs))
            names = RuntimeNames(**{kind: table for kind, table in given if table is not None})
        self.names = names
        self._name = name
        self._jit = None                  # JitSymbols: made at the first frame in anonymous memory
        self._kernel = None               # KernelSymbols: read on first use
        self._source_wanted = options.lines or options.inlines
        self._modules: dict = {}          # mapping path -> module name shown
        # (mapped path, object path, file offset, address, back) -> (frames,
        # exact): a place in a mapped file names the same way in every stack
        # through it (and in forked processes, at the same address): named
        # once, and one Frame object handed out for it, which a sink can
        # know by identity without reading it again
        self._places: dict = {}
        # (mapped path, object path, file offset, back) -> (frames, exact,
        # address): a place named at one address; at another (another
        # process of the program: ASLR) its frames are copies with that
        # address, each copy's original in copied_from, so that a sink knows
        # a copy's names by its original's identity, without reading it
        self._named: dict = {}
        self.copied_from: dict = {}       # id(a copied Frame) -> its original Frame
        # called with the frames of each place named afresh (not copies):
        # a sink that reads Frames (--to) reads them now, in memory still
        # warm, not at its interval's end; None for every other run
        self.on_named = None
        # an interpreter frame's tag -> (the kind of the run's names of it, its parts)
        self._script_kinds = {_PHP_TAG: ("php", php_frame_parts),
                              _RUBY_TAG: ("ruby", ruby_frame_parts),
                              _V8_TAG: ("js", v8_frame_parts),
                              _PERL_TAG: ("perl", perl_frame_parts),
                              _JAVA_TAG: ("java", java_frame_parts)}

    # the runtimes' names tables, made if they are not yet
    python_code = property(lambda self: self.names.get("python"))
    v8 = property(lambda self: self.names.get("js"))
    php = property(lambda self: self.names.get("php"))
    perl = property(lambda self: self.names.get("perl"))
    ruby = property(lambda self: self.names.get("ruby"))
    java = property(lambda self: self.names.get("java"))

    def _named_by_runtime(self, pid: int) -> bool:
        """Whether a runtime's walk names process pid's JIT frames (JS, Java)."""
        return any(table is not None and table.named_in(pid)
                   for table in (self.names.made("js"), self.names.made("java")))

    @property
    def warnings(self) -> list:
        runtimes = [self.names.made(kind) for kind in ("js", "perl", "ruby", "java")]
        jit = self._jit.notes() if self._jit is not None else []
        return (self._said + jit + self._elf.fetch_notes()
                + self._elf.name_source_notes()
                + [w for table in runtimes if table is not None for w in table.warnings])

    def debug_arrived(self) -> bool:
        """Whether a debug file arrived from a debuginfod server since
        last asked (names made before may be named better now)."""
        if not self._elf.refresh():
            return False
        self._forget_places()
        return True

    def _forget_places(self) -> None:
        """Places named afresh from now on (the copies with their
        originals: a copy's id stays its while copied_from names it)."""
        self._places.clear()
        self._named.clear()
        self.copied_from.clear()

    def stack_named(self, pid: int, frames, whole: bool) -> None:
        """Told a stack's frames, and whether no limit cut it short."""
        if self._jit is not None:       # else no frame was in a JIT's memory
            self._jit.stack_named(pid, frames, whole)

    def jit_version(self, pid: int) -> int:
        """Changes when process `pid`'s perf map does (see JitSymbols.version)."""
        return self._jit.version(pid) if self._jit is not None else 0

    def _jit_symbols(self):
        """JitSymbols (perfmap.py), made (and imported) at the first frame
        in memory without a file: a run of compiled programs never does."""
        if self._jit is None:
            from .perfmap import JitSymbols
            self._jit = JitSymbols(self._name, self._said, getattr(self.mappings, "paths", None),
                                   self._named_by_runtime)
        return self._jit

    def frames(self, pid: int, addrs, leaf_is_exact: bool = True) -> tuple:
        out = []
        exact = leaf_is_exact
        for addr in addrs:
            script = self._script_frame(addr)
            if script is not None:
                # an interpreter's frame where the walk met its C frame (or,
                # for JS, its JIT or builtin pc): the native frame after it
                # is a return address
                names, parts = script
                out.append(names.frame(pid, *parts(addr)))
                exact = False
                continue
            # Return addresses point after the call; addr-1 is still inside
            # the calling function even when the call is its last instruction.
            # A signal handler "returns" to the first byte of the sigreturn
            # trampoline, and the frame after it is the interrupted pc: both
            # are exact.
            frames, exact = self._frames_at(pid, addr, 0 if exact else 1)
            out.extend(frames)
        return tuple(out)

    def _script_frame(self, addr: int):
        """(the run's names of its kind, its parts function) when `addr` is
        an interpreter frame's tagged word whose names the run keeps (a
        Python word always; PHP's, Ruby's, JS's and Perl's only where the
        capture's walk writes them: a native address never reaches 0xA<<60)."""
        tag = addr >> 60
        if tag < _LOWEST_TAG:
            return None
        if tag == _PYTHON_TAG:
            return self.names.get("python"), python_frame_parts
        kind_parts = self._script_kinds.get(tag)
        if kind_parts is None:
            return None
        names = self.names.active(kind_parts[0])
        return (names, kind_parts[1]) if names is not None else None

    def frames_at(self, pid: int, addr: int, back: int = 0) -> list:
        """The frame of the function holding addr, preceded (with
        --inlines) by the calls inlined there, innermost first."""
        return list(self._frames_at(pid, addr, back)[0])

    def _frames_at(self, pid: int, addr: int, back: int) -> tuple:
        """(frames_at(), whether addr was a signal handler's return into
        the sigreturn trampoline, named exactly: the next pc is exact too)."""
        at = normalize(self.mappings, pid, addr - back)
        if at is None:
            return [Frame(addr=addr, module="")], False
        m, path, file_off = at
        if path is None:                          # memory without a file
            if is_vdso(m):
                return [unnamed_frame(m, addr)], False
            return [self._jit_symbols().frame(pid, m, addr, back)], False
        place = (m.path, path, file_off, addr, back)
        found = self._places.get(place)
        if found is None:
            if len(self._places) >= _MAX_PLACES:
                self._forget_places()
            found = self._places[place] = self._place_frames(pid, m, path, file_off, addr, back)
        return found

    def _place_frames(self, pid: int, m, path: str, file_off: int, addr: int,
                      back: int) -> tuple:
        """_file_frames() of a place not met at this address: copies of the
        frames named for it at another address, the address changed (every
        other field is the place's in the file), or named afresh."""
        content = (m.path, path, file_off, back)
        named = self._named.get(content)
        if named is None or named[2] is None:
            found = self._file_frames(pid, m, path, file_off, addr, back)
            if self.on_named is not None:
                self.on_named(found[0])
            if named is None:        # copied only where every frame is at the place's address
                self._named[content] = (*found, addr if all(f.addr == addr for f in found[0])
                                        else None)
            return found
        frames, exact, _at = named
        copies = tuple(_moved(f, addr) for f in frames)
        self.copied_from.update(zip(map(id, copies), frames))
        return copies, exact

    def _file_frames(self, pid: int, m, path: str, file_off: int, addr: int,
                     back: int) -> tuple:
        """_frames_at() of an address in a mapped file (its frames a tuple:
        kept and handed out again)."""
        vaddr, sym = self._elf.resolve(path, file_off)
        if back and vaddr is not None and (sym is None or vaddr + 1 >= sym.address + sym.size):
            # addr starts a function, as no return address does but the
            # trampoline's (checked only here: ~4 us a frame otherwise)
            image = self._elf.image(path)
            if image is not None and image.file.read(vaddr + 1, len(RESTORE_RT)) == RESTORE_RT:
                return self._frames_at(pid, addr, 0)[0], True
        module = self._modules.get(m.path)
        if module is None:
            module = self._module(m)
        if vaddr is not None and (sym is None or self._source_wanted):
            go_symbols = self._go_symbols or self._go()
            go = go_symbols.table(path)           # Go names even when stripped
            if go is not None:
                return tuple(go_symbols.frames(go, m, module, addr, vaddr, back)), False
        return tuple(self._elf.frames(m, path, module, addr, back, vaddr, sym)), False

    def _go(self):
        """GoSymbols, made (and symbols/go.py imported) when first needed."""
        from .go import GoSymbols
        self._go_symbols = GoSymbols(self.options, self._elf.image)
        return self._go_symbols

    def _module(self, m) -> str:
        """The name frames show for m's object, memoized: basename() costs
        more than the rest of a cached frame."""
        if len(self._modules) >= _MAX_MODULES:
            self._modules.clear()
        module = VDSO_MODULE if is_vdso(m) else printable(os.path.basename(m.path))
        self._modules[m.path] = module
        return module

    def kernel_frames(self, addrs) -> tuple:
        """Frames of kernel addresses (a kernel stack), innermost first."""
        if self._kernel is None:
            from .kernel import KernelSymbols   # kernel stacks only
            self._kernel = KernelSymbols()
        return tuple(self._kernel.frame(a) for a in addrs)


def _moved(frame: Frame, addr: int) -> Frame:
    """frame at another address: its fields copied as they are (values.replace
    passes each through __init__: ~6 times the cost, for every frame of a
    new process of a program met before)."""
    copy = Frame.__new__(Frame)
    fields = copy.__dict__
    fields.update(frame.__dict__)
    fields["addr"] = addr
    return copy


def _demangled_printable(name: str) -> str:
    return printable(demangle(name))
