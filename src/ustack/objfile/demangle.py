"""Mangled linker names -> the names people write: C++ (Itanium ABI, through
libstdc++'s __cxa_demangle, native/cxxabi.py), Rust legacy (`_ZN…17h<hash>E`) and
Rust v0 (`_R…`) through rustc-demangle (pyderust), which drops the hash the
way Rust's own backtraces do. A name neither understands stays as it is.

Each name is demangled once (cache): a profile repeats the same few."""
from __future__ import annotations

import importlib
import re


def _library(name: str):
    """A demangling library, imported on the first name that needs it,
    so a C-only run never pays for it. None when missing (a dependency:
    raw names without it)."""
    lib = _libraries.get(name)
    if lib is None:
        try:
            lib = importlib.import_module(name)
        except ImportError:  # pragma: no cover
            lib = False
        _libraries[name] = lib
    return lib or None


_libraries: dict = {}

# rustc ends every legacy name with a 16-hex-digit hash component; C++
# names never look like that, so this is what tells the two _ZN apart.
_RUST_LEGACY = re.compile(r"^_ZN.*17h[0-9a-f]{16}E(\.\S*)?$")
_MAX_CACHED = 1 << 18

_cache: dict = {}


def demangle(name: str) -> str:
    if not name.startswith(("_Z", "_R")):
        return name
    out = _cache.get(name)
    if out is None:
        out = _demangle(name)
        if len(_cache) >= _MAX_CACHED:
            _cache.clear()
        _cache[name] = out
    return out


def is_mangled(name: str) -> bool:
    return name.startswith(("_Z", "_R"))


def _demangle(name: str) -> str:
    if name.startswith("_R") or _RUST_LEGACY.match(name):
        pyderust = _library("pyderust")
        if pyderust is not None:
            try:
                return pyderust.demangle(name)
            except (ValueError, RuntimeError):
                pass
        if name.startswith("_R"):
            return name
    if name.startswith("_Z"):
        from ..native.cxxabi import cxa_demangle
        try:
            out = cxa_demangle(name.encode())
            return out.decode() if out is not None else name
        except (UnicodeError, ValueError):   # a NUL or surrogate in a bad symbol
            pass
    return name


def plain_name(name: str) -> str:
    """A demangled name without its parameter list and qualifiers, as a
    user types it in a probe: `ns::f(long) const` -> `ns::f`. Template
    arguments stay (`max<int>`)."""
    if not name.endswith((")", " const", " volatile", "&", "]")) or "(" not in name:
        return name
    if name.endswith("]"):     # " [clone .cold]": a part, not a function to probe
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        c = name[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return name[:i]
    return name
