"""An object's functions built in a child process (objfile/builders.py),
for the objects whose symbol tables are big (node: 86,000 functions,
~1.3 s of Python): the child (objfile/function_child.py) parses them and
writes the image cache while the run reads samples; ElfImage, asked for
those functions, waits for the child and reads the cache back
(objfile/elf.py)."""
from __future__ import annotations

from . import builders

BIG_SYMBOL_TABLES = 512 << 10   # bytes of .symtab + .dynsym worth a child (~21,000 symbols, ~0.35 s)
_KIND = "functions"
NOTHING_WAITS_NICENESS = 10     # as unwind/tables.py's builders nothing waits for


def worth_a_child(image) -> bool:
    """Whether `image`'s functions are big enough to build apart."""
    sections = image.file.sections
    return sum(sections.get(name, (0, 0, 0))[2]
               for name in (".symtab", ".dynsym")) >= BIG_SYMBOL_TABLES


def start(image):
    """Build `image`'s functions in a child, unless they are built, being
    built, or small enough to build here when asked. The child (a Popen)
    or None."""
    if not image.symbols.pending or not worth_a_child(image):
        return None
    return builders.start((_KIND, image.path), "ustack.objfile.function_child", [image.path])


def wait(path: str) -> None:
    """Wait for the child building the functions of the object at `path`,
    if there is one."""
    builders.wait((_KIND, path))




def running(path: str) -> bool:
    """Whether a child is building the functions of the object at `path`
    now."""
    return builders.running((_KIND, path))


def nothing_waits(path: str) -> None:
    """The run names the object at `path` without its child (a scan,
    objfile/symbol_scan.py): the child, building for the cache now, yields
    the CPU to the run."""
    builders.nothing_waits((_KIND, path), NOTHING_WAITS_NICENESS)
