"""Whether an object is CRuby's VM (libruby-3.X.so, or a ruby executable
built without it), and how that version lays out what the in-kernel Ruby
pass (bpf/ruby.h) and the name reader (symbols/ruby.py) follow.

From the object's own file, read once per file:
- its version: the `ruby_version` string ("3.1.2");
- `rb_vm_exec`'s address range: each native frame in it ran the Ruby
  frames of one VM call (vm_exec), so the Ruby frames go there;
- the thread's execution context `ruby_current_ec`, a thread-local in
  libruby 3.x reached the general-dynamic way (__tls_get_addr): its
  offset in the module's TLS block (the symbol's st_value) and the GOT
  slot of its R_X86_64_DTPMOD64 relocation, where ld.so writes the
  module's TLS id. The kernel goes fsbase -> the thread's DTV (tcbhead_t
  .dtv, fsbase + 8) -> the module's block (dtv[id], 16-byte entries) ->
  the ec: each thread's own, no per-process step.

The struct offsets are not in the (stripped) file: they are fixed per
minor version on x86-64 and were checked on Debian 12's libruby 3.1.2
by reading a running script's frames (tests/test_ruby_frames.py checks the
names that follow from them). Sources: ruby's vm_core.h and iseq.h of the
3.1 branch (rb_execution_context_struct: vm_stack 0, vm_stack_size 8, cfp
16; rb_control_frame_struct: pc 0, iseq 16, ep 32, and 64 bytes in all
since 3.1 added jit_return; rb_iseq_struct.body 16;
rb_iseq_constant_body: type 0, iseq_size 4, iseq_encoded 8, location 64,
insns_info body 120 / size 136 / succ_index_table 144;
rb_iseq_location_struct: pathobj 0, base_label 8, label 16, first_lineno
24; rb_iseq_constant_body.local_iseq 176 (a block's method); iseq_insn_info_entry 12 bytes, line_no first), as the OpenTelemetry
eBPF profiler's Ruby support also has them. For a method's class:
rb_method_entry_struct.owner 32; RClass's rb_classext_struct pointer 24
(a build of one size pool, as 3.1's default) and the classext's iv_tbl 8,
where a named class keeps its path (`__classpath__`) and a singleton
class the object it is of (`__attached__`). A version not in LAYOUTS is
not followed (its frames stay the C frames they are), never guessed at."""
from __future__ import annotations

import os
import re
import struct

from ..model import UstackError
from ..objfile.elf import ElfImage
from ..values import value
from .runtime_files import may_be

EXEC_FUNCTION = "rb_vm_exec"
CURRENT_EC = "ruby_current_ec"
CURRENT_VM = "ruby_current_vm_ptr"     # the VM: its threads, for a reader in user space
_DTPMOD64 = 16                  # R_X86_64_DTPMOD64
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")

# per (major, minor): byte offsets (names as bpf/ruby.h's struct ruby_layout)
LAYOUTS = {
    (3, 1): dict(ec_vm_stack=0, ec_vm_stack_size=8, ec_cfp=16,
                 cfp_pc=0, cfp_iseq=16, cfp_ep=32, cfp_size=64,
                 iseq_body=16, body_type=0, body_iseq_size=4, body_iseq_encoded=8,
                 body_location=64, body_insns_info=120, body_insns_info_size=136,
                 body_succ_index_table=144,
                 location_pathobj=0, location_base_label=8, location_label=16,
                 location_first_lineno=24, insn_info_entry_size=12,
                 body_local_iseq=176, me_owner=32, class_ext=24, ext_iv_tbl=8,
                 # rb_vm_t.ractor.main_thread; rb_thread_t's lt_node (its
                 # ractor's list), vm, ec and thread_id (a pthread_t: its
                 # struct pthread); rb_execution_context_t.thread_ptr. Read
                 # back from a running 3.1.2 script (each checked by pointing
                 # back: th->vm is the VM, ec->thread_ptr the thread)
                 vm_main_thread=40, thread_vm=32, thread_ec=40, thread_id=80,
                 ec_thread=48),
}


@value
class Runtime:
    """A Ruby VM object: its version, where rb_vm_exec and the ec are (ELF
    addresses), and its version's layout."""
    path: str
    version: tuple              # (major, minor, patch)
    exec_start: int
    exec_end: int
    ec_tls_offset: int          # ruby_current_ec's offset in the module's TLS block
    ec_module_got: int          # the GOT slot ld.so writes the module's TLS id into
    layout: tuple               # sorted (name, value) pairs
    vm_ptr: int                 # ruby_current_vm_ptr (0: not exported)

    def field(self, name: str) -> int:
        return dict(self.layout)[name]


def object_runtime(path: str) -> Runtime | None:
    """The Ruby VM the object at `path` is, or None: asked of every object
    whose rows load, so a name test comes before the file."""
    if not may_be("ruby", path):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _runtimes:
        _runtimes[key] = _read_runtime(path)
    return _runtimes[key]


_runtimes: dict = {}


def _read_runtime(path: str) -> Runtime | None:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
        file = ElfImage.open(path).file
        if file.elfclass != 64 or not file.little_endian:
            return None
        dynsym = file.section_bytes(".dynsym") or b""
        dynstr = file.section_bytes(".dynstr") or b""
        symbols = _symbols(dynsym, dynstr,
                           (EXEC_FUNCTION, CURRENT_EC, "ruby_version", CURRENT_VM))
        if any(n not in symbols for n in (EXEC_FUNCTION, CURRENT_EC, "ruby_version")):
            return None
        version_at = symbols["ruby_version"][1]
        text = file.read(version_at, 16).split(b"\0")[0].decode("ascii", "replace")
        m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", text)
        if m is None:
            return None
        version = tuple(int(x) for x in m.groups())
        layout = LAYOUTS.get(version[:2])
        if layout is None:
            return None
        got = _dtpmod_slot(file.section_bytes(".rela.dyn") or b"", symbols[CURRENT_EC][0])
        if got is None:
            return None
    except (OSError, UstackError, struct.error, ValueError):
        return None
    _index, exec_at, exec_size = symbols[EXEC_FUNCTION]
    return Runtime(path=path, version=version, exec_start=exec_at,
                   exec_end=exec_at + exec_size, ec_tls_offset=symbols[CURRENT_EC][1],
                   ec_module_got=got, layout=tuple(sorted(layout.items())),
                   vm_ptr=symbols[CURRENT_VM][1] if CURRENT_VM in symbols else 0)


def _symbols(dynsym: bytes, dynstr: bytes, names: tuple) -> dict:
    """{name: (symbol index, st_value, st_size)} of the defined ones."""
    wanted = {n.encode(): n for n in names}
    found = {}
    for index in range(len(dynsym) // _SYM.size):
        st_name, _info, _other, shndx, val, size = _SYM.unpack_from(dynsym, index * _SYM.size)
        end = dynstr.find(b"\0", st_name)
        name = wanted.get(dynstr[st_name:end])
        if name is not None and shndx != 0:
            found[name] = (index, val, size)
    return found


def _dtpmod_slot(rela: bytes, symbol_index: int) -> int | None:
    """The GOT address of the symbol's R_X86_64_DTPMOD64 relocation."""
    for offset, info, _addend in _RELA.iter_unpack(rela[:len(rela) - len(rela) % _RELA.size]):
        if info & 0xFFFFFFFF == _DTPMOD64 and info >> 32 == symbol_index:
            return offset
    return None
