"""An object's functions built in a child process, for the objects whose
symbol tables are big (node: 86,000 functions, ~1.4 s of Python): the
child parses them and writes the image cache while this process goes on
reading samples, on another CPU and under another GIL, and its memory is
returned when it exits. ElfImage, asked for those functions, waits for
the child and reads the cache back (objfile/elf.py).

Builders still running when this process exits are killed (atexit); one
whose parent was killed outright ends by itself when its work is done
(~1.5 s for node; PR_SET_PDEATHSIG would fire when the thread that
started it ends, not the process). A child writes only through
objfile/cache.py, as this process would."""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from pathlib import Path

BIG_SYMBOL_TABLES = 512 << 10   # bytes of .symtab + .dynsym worth a child (~21,000 symbols, ~0.35 s)

_children: dict = {}            # image path -> Popen
_lock = threading.Lock()


def worth_a_child(image) -> bool:
    """Whether `image`'s functions are big enough to build apart."""
    tables = sum(image.file.sections.get(name, (0, 0))[1] for name in (".symtab", ".dynsym"))
    return tables >= BIG_SYMBOL_TABLES


def start(image):
    """Build `image`'s functions in a child, unless they are built, being
    built, or small enough to build here when asked. The child (a Popen)
    or None."""
    if "_deferred" not in image.symbols.__dict__ or not worth_a_child(image):
        return None
    with _lock:
        if image.path in _children:
            return _children[image.path]
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH")) if p)
        if not _children:
            atexit.register(stop_all)
        try:
            _children[image.path] = subprocess.Popen(
                [sys.executable, "-m", "ustack.objfile.function_builder", image.path],
                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        except OSError:
            return None                 # built here when asked
        return _children[image.path]


def wait(path: str) -> None:
    """Wait for the child building the functions of the object at `path`,
    if there is one (a signal still interrupts the wait)."""
    with _lock:
        child = _children.get(path)
    if child is not None:
        child.wait()


def stop_all() -> None:
    """Kill the builders still running: the run is over."""
    with _lock:
        children = list(_children.values())
        _children.clear()
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait()


def main() -> None:
    from ..model import UstackError
    from .elf import ElfImage
    ElfImage.keeps_raw_functions = False    # ~0.15 s of node's; the image cache is read
    try:
        ElfImage.open(sys.argv[1]).symbols.functions    # parsed, and the cache written
    except UstackError:
        sys.exit(1)


if __name__ == "__main__":
    main()
