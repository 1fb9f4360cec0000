"""Where a PHP process keeps its script's frames.

The interpreter is the mapped object (the php CLI, php-fpm, php-cgi,
libphp.so) that defines `executor_globals` (a build without thread safety,
NTS, as Debian's: a ZTS build keeps its globals per thread and is not
followed) and `execute_ex`. executor_globals.current_execute_data starts
the chain of zend_execute_data, each with its function (zend_function:
type, name, class, file, first line), its current opline (the line) and
prev_execute_data. execute_ex is the hybrid VM's one function: a native
frame there ran the PHP frames up to one flagged ZEND_CALL_TOP.

The offsets per Zend API number (the version's; in the binary as
"API20220829,NTS"). PHP 8.2 (API 20220829): offsetof() in a program built
against Debian's php8.2-dev headers (/usr/include/php/20220829: Zend/
zend_globals.h, zend_compile.h, zend_types.h), the same values read back
from a running php8.2 (8.2.36) script's memory; no debug symbols exist for
Debian 12's php8.2 (the OpenTelemetry eBPF profiler's PHP walker ends an
executor call's frames at the same ZEND_CALL_TOP flag). php.h reads the
op_array's filename and line_start in one read: 8 bytes apart here. Other
versions are not followed: their stacks stay native, never misnamed.
"""
from __future__ import annotations

import os
import re
from collections import namedtuple

from ..model import UstackError
from ..objfile import symbol_by_name
from ..objfile.elf import ElfImage
from .runtime_files import may_be

GLOBALS = "executor_globals"
EXECUTE = "execute_ex"

# ZEND_CALL_TOP (zend_compile.h: (1 << 17) of the call info, the upper
# half of This.u1.type_info) and ZEND_USER_FUNCTION (1 for internal)
_CALL_TOP = 1 << 17
_USER_FUNCTION = 2

# per Zend API number: (major, minor) and the offsets php.h's struct
# php_object names
LAYOUTS = {
    20220829: ((8, 2), dict(
        eg_current_execute_data=488,    # zend_executor_globals.current_execute_data
        ed_opline=0, ed_func=24,        # zend_execute_data
        ed_call_info=40,                # This.u1.type_info
        ed_prev=48,                     # prev_execute_data
        op_lineno=24,                   # zend_op.lineno
        fn_name=8, fn_scope=16,         # zend_function.common.function_name, .scope
        fn_filename=152, fn_line_start=160,     # zend_op_array.filename, .line_start
        ce_name=8,                      # zend_class_entry.name
        str_len=16, str_val=24,         # zend_string.len, .val
        call_top=_CALL_TOP, user_function=_USER_FUNCTION)),
}


# A PHP interpreter object, at its ELF addresses: version (major, minor),
# execute_ex's (start, end), sorted (name, offset) of LAYOUTS. A namedtuple,
# not typing's NamedTuple: every run with PHP frames on (the default)
# imports this module, and typing cost it ~3.6 ms
Interpreter = namedtuple("Interpreter",
                         "path version executor_globals execute_range layout")


def looks_like_php(path: str) -> bool:
    """Cheap test before reading the file's symbols (runtime_files.py)."""
    return may_be("php", path)


def object_interpreter(path: str) -> Interpreter | None:
    """The interpreter the object at `path` defines, or None when it is
    none ustack has a layout for."""
    if not looks_like_php(path):
        return None
    key = _identity(path)
    if key is None:
        return None
    if key not in _found:
        _found[key] = _read(path)
    return _found[key]


_found: dict = {}


def _identity(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _read(path: str) -> Interpreter | None:
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
        # an image of its own: this runs on the run's rows loader thread
        image = ElfImage(path)
        symbols = symbol_by_name.addresses(image.file, (GLOBALS, EXECUTE))
        if GLOBALS not in symbols or EXECUTE not in symbols:
            return None
        api = api_number(image.file.section_bytes(".rodata") or b"")
        if api not in LAYOUTS:
            return None
        version, layout = LAYOUTS[api]
        ranges = [(s.address, s.address + s.size) for s in image.functions
                  if s.name == EXECUTE and s.size]
    except (OSError, ValueError, UstackError):
        return None
    if len(ranges) != 1 or ranges[0][0] != symbols[EXECUTE]:
        return None
    return Interpreter(path=path, version=version, executor_globals=symbols[GLOBALS],
                       execute_range=ranges[0], layout=tuple(sorted(layout.items())))


def api_number(rodata: bytes) -> int | None:
    """The Zend API number of a build without thread safety ("API20220829,NTS"
    in its .rodata), or None (none, or a ZTS build)."""
    m = re.search(rb"API(\d{8}),NTS\x00", rodata)
    return int(m.group(1)) if m else None
