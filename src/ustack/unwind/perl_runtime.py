"""Whether an object is a Perl interpreter, and how its version lays out
what the in-kernel pass reads (bpf/perl.h).

The interpreter is an object that exports PL_curinterp, PL_thr_key and
Perl_runops_standard: Debian's /usr/bin/perl has it linked in (the
executable does not use libperl.so), an embedding program has libperl.so.
Its version comes from the object itself (the PL_revision, PL_version and
PL_subversion bytes it exports). Perl publishes no layout of its structures
at run time, so the offsets are per version, taken from that version's
headers compiled with Debian's build configuration (ithreads, x86-64):
offsetof() over CORE/intrpvar.h (PerlInterpreter), cop.h (struct
stackinfo, PERL_CONTEXT, COP), cv.h (XPVCV), gv.h (XPVGV), hv.h
(xpvhv_with_aux, xpvhv_aux) and hv.h's HEK; checked against a running
perl 5.36.0 by reading a known call chain from its memory. A version
without a layout here is not followed: its frames stay as walked."""
from __future__ import annotations

import os
import struct

from ..model import UstackError
from ..objfile import symbol_by_name
from ..objfile.elf import ElfImage
from ..values import value
from .runtime_files import may_be

RUN_LOOP = "Perl_runops_standard"
SYMBOLS = ("PL_curinterp", "PL_thr_key", "PL_revision", "PL_version", "PL_subversion")

# perl 5.36, ithreads (MULTIPLICITY), x86-64: offsetof() from its headers
LAYOUT_5_36 = {
    "interp_curcop": 208,          # PerlInterpreter.Icurcop
    "interp_curstackinfo": 224,    # .Icurstackinfo
    "interp_main_cv": 1800,        # .Imain_cv
    "si_cxstack": 8,               # struct stackinfo
    "si_prev": 16,
    "si_cxix": 32,                 # I32
    "cx_size": 104,                # sizeof(PERL_CONTEXT)
    "cx_oldcop": 16,               # cx_u.cx_blk.blku_oldcop
    "cx_sub_cv": 72,               # cx_u.cx_blk.blk_u.blku_sub.cv
    "cop_line": 36,                # line_t (U32)
    "cop_file": 48,                # char * with ithreads (CopFILE)
    "cv_stash": 32,                # XPVCV.xcv_stash
    "cv_gv": 56,                   # XPVCV.xcv_gv_u: GV, or a HEK when CVf_NAMED
    "cv_flags": 92,                # XPVCV.xcv_flags (U32)
    "cv_file": 64,                 # XPVCV.xcv_file: CvFILE (char *)
    "cv_named": 0x8000,            # CVf_NAMED
    "gv_name": 32,                 # XPVGV.xiv_u.xivu_namehek
    "gv_stash": 40,                # XPVGV.xnv_u.xgv_stash
    "sv_flags": 12,                # struct sv.sv_flags
    "sv_ook": 0x2000000,           # SVf_OOK: a stash's name is in its aux part
    "hv_aux": 32,                  # xpvhv_with_aux.xhv_aux
    "aux_name": 0,                 # xpvhv_aux.xhv_name_u
    "aux_name_count": 28,          # xpvhv_aux.xhv_name_count (I32)
    "hek_key": 8,                  # HEK.hek_key
}
LAYOUTS = {(5, 36): LAYOUT_5_36}
# glibc 2.36 x86-64: offsetof(struct pthread, specific_1stblock), where a
# thread's values of the first 32 pthread keys are (seq, data) pairs; found
# at fsbase + 0x318 holding pthread_getspecific(PL_thr_key == 0) in a perl
PTHREAD_SPECIFIC = 0x310
# glibc 2.36 x86-64: offsetof(struct pthread, tid)
PTHREAD_TID = 0x2D0
PTHREAD_KEYS_1ST = 32           # keys whose values are in the struct itself


@value
class Interpreter:
    """A Perl object: its version, the ELF addresses the pass needs, and
    the layout of its version."""
    path: str
    version: tuple              # (5, minor, patch)
    curinterp: int
    thr_key: int
    run_loop: tuple             # (start, end) of Perl_runops_standard
    layout: tuple               # sorted (name, value) pairs: LAYOUT_5_36's names

    def field(self, name: str) -> int:
        return dict(self.layout)[name]


def object_interpreter(path: str) -> Interpreter | None:
    """The Perl interpreter the object at `path` is, or None: asked of every
    object whose rows load, so a name test comes before the file."""
    return interpreter_of(path) if may_be("perl", path) else None


_interpreters: dict = {}


def interpreter_of(path: str) -> Interpreter | None:
    """The Perl interpreter at `path`, memoized by the file's identity."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _interpreters:
        _interpreters[key] = _read_interpreter(path)
    return _interpreters[key]


def _read_interpreter(path: str) -> Interpreter | None:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
        image = ElfImage.open(path)
        symbols = symbol_by_name.addresses(image.file, SYMBOLS)
        if any(name not in symbols for name in SYMBOLS):
            return None
        version = tuple(image.read(symbols[name], 1)[0]
                        for name in ("PL_revision", "PL_version", "PL_subversion"))
        layout = LAYOUTS.get(version[:2])
        if layout is None:
            return None
        loops = [(s.address, s.address + s.size) for s in image.functions
                 if s.name == RUN_LOOP and s.size]
    except (OSError, UstackError, struct.error, IndexError):
        return None
    if len(loops) != 1:
        return None
    layout = dict(layout, pthread_specific=PTHREAD_SPECIFIC)
    return Interpreter(path=path, version=version, curinterp=symbols["PL_curinterp"],
                       thr_key=symbols["PL_thr_key"], run_loop=loops[0],
                       layout=tuple(sorted(layout.items())))
