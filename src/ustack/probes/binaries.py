"""Finding the binary a probe or a listing names: a path (as a process
sees it, in its own root), or a bare library or program name. Apart from
the uprobe resolver, whose imports (disassembly, debug files: ~11 ms) a
`list` does not need."""
from __future__ import annotations

import os

from ustack.kernel.procfs import executable_mappings
from ustack.model import UstackError


def locate_binary(path: str, pid: int | None = None) -> tuple:
    """(path to open on this host, path to show the user) for a file path or
    a bare library/program name such as libc, c, libc.so.6 or bash."""
    if pid is not None and not os.path.isdir(f"/proc/{pid}"):
        raise UstackError(f"no such process: {pid}")
    if "/" in path:
        if pid is not None and path.startswith("/"):
            return _in_process_root(path, pid)
        if os.path.isfile(path):
            real = os.path.realpath(path)
            return real, real
    elif pid is not None:
        for m in executable_mappings(pid):
            if m.path.startswith("/") and _names_library(os.path.basename(m.path), path):
                return m.open_path, m.path
    else:
        import shutil
        found = _ldconfig_lookup(path) or shutil.which(path)
        if found:
            real = os.path.realpath(found)
            return real, real
    raise UstackError(f"no such binary or library: {path}")


def _names_library(basename: str, name: str) -> bool:
    return (basename == name or basename.startswith(name + ".so")
            or basename.startswith("lib" + name + ".so"))


def _ldconfig_lookup(name: str) -> str | None:
    import subprocess
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                             check=False).stdout
    except OSError:
        return None
    matches = []
    for line in out.splitlines():
        # "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
        left, arrow, target = line.strip().partition(" => ")
        lib, _, flags = left.partition(" ")
        if arrow and "x86-64" in flags and _names_library(lib, name):
            matches.append((lib != name, target))
    return min(matches, key=lambda m: m[0])[1] if matches else None


def _in_process_root(path: str, pid: int) -> tuple:
    """A path as process `pid` sees it, which may be in another mount
    namespace: symlinks are followed inside that root, not ours."""
    root = f"/proc/{pid}/root"
    try:
        same_root = os.path.samestat(os.stat(root), os.stat("/"))
    except OSError:
        raise UstackError(f"no such process: {pid}") from None
    inner = os.path.realpath(path) if same_root else realpath_in_root(root, path)
    host = inner if same_root else root + inner
    if not os.path.isfile(host):
        raise UstackError(f"no such binary or library: {path}")
    return host, inner


def realpath_in_root(root: str, path: str) -> str:
    """os.path.realpath of `path` as a process whose root directory is
    `root` sees it: symlinks (absolute ones too) are followed inside
    `root`, and `..` never climbs above it. Returns the path inside root."""
    todo = [p for p in path.split("/") if p]
    done: list = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part in (".", ".."):
            if part == ".." and done:
                done.pop()
            continue
        try:
            target = os.readlink(root + "/" + "/".join(done + [part]))
        except OSError:  # not a symlink (or missing: the caller checks)
            done.append(part)
            continue
        hops += 1
        if hops > 40:
            raise UstackError(f"{path}: too many levels of symbolic links")
        if target.startswith("/"):
            done = []
        todo = [p for p in target.split("/") if p] + todo
    return "/" + "/".join(done)
