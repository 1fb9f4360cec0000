"""An object's functions built in a child process (objfile/builders.py),
for the objects whose symbol tables are big (node: 86,000 functions,
~1.3 s of Python): the child (objfile/function_child.py) parses them and
writes the image cache while the run reads samples; ElfImage, asked for
those functions, waits for the child and reads the cache back
(objfile/elf.py), or names addresses by a scan meanwhile. A
whole-machine run sends its middle-sized objects' to one long-lived
child (start_shared)."""
from __future__ import annotations

from . import builders

BIG_SYMBOL_TABLES = 512 << 10   # bytes of .symtab + .dynsym worth a child (~21,000 symbols, ~0.35 s)
_KIND = "functions"
NOTHING_WAITS_NICENESS = 10     # until waited for; as unwind/tables.py's builders nothing waits for


def worth_a_child(image) -> bool:
    """Whether `image`'s functions are big enough to build apart."""
    return symbol_table_bytes(image) >= BIG_SYMBOL_TABLES


def symbol_table_bytes(image) -> int:
    """The size of `image`'s .symtab and .dynsym together."""
    sections = image.file.sections
    return sum(sections.get(name, (0, 0, 0))[2] for name in (".symtab", ".dynsym"))


def start(image):
    """Build `image`'s functions in a child, unless they are built, being
    built, or small enough to build here when asked. The child (a Popen)
    or None. Nothing waits for it yet (they are built ahead of need): it
    yields the CPU until wait()."""
    if not image.symbols.pending or not worth_a_child(image):
        return None
    return builders.start((_KIND, image.path), "ustack.objfile.function_child", [image.path],
                          niceness=NOTHING_WAITS_NICENESS)


def wait(path: str) -> None:
    """Wait for the child building the functions of the object at `path`,
    if there is one: the run needs them now, and the child runs at the
    run's own niceness from here."""
    builders.wait((_KIND, path), run_waits=True)




# bytes of .symtab + .dynsym from which an object named during a
# whole-machine run has its functions built by the run's long-lived
# functions builder, and named meanwhile by a scan (objfile/symbol_scan.py:
# libcrypto's 8,000 entries ~19 ms, its whole table built and saved here
# ~57 ms; a cold whole-machine run names ~10 such objects)
SHARED_SYMBOL_TABLES = 32 << 10
_named_apart: list = []         # [True] once a run asked build_named_apart()


def build_named_apart(apart: bool = True) -> None:
    """From now on (`apart` False: no longer), start_shared() sends the
    middle-sized objects named to one long-lived builder: a whole-machine
    run names many of them (one builder's start-up, ~0.2 s of CPU, pays
    off); a short -p or -c run naming libc alone builds it here."""
    _named_apart[:] = [True] if apart else []


def start_shared(image) -> bool:
    """Build `image`'s functions in the run's one long-lived functions
    builder (builders.start(shared=True): one Python start-up for all the
    middle-sized objects a run names, libpython, libstdc++, libcrypto,
    libc's debug file, ...), if build_named_apart() was asked, unless they
    are built, a child of their own builds them, or they are small enough
    to build here at once. Whether a builder has the job now; the caller
    names the object by a scan meanwhile, and the run does not wait for
    the builder."""
    if not _named_apart or not image.symbols.pending or worth_a_child(image):
        return False
    if image.path.startswith("/proc/"):
        return False                # a pinned /proc/self/fd/N: this process's alone
    if symbol_table_bytes(image) < SHARED_SYMBOL_TABLES:
        return False
    proc = builders.start((_KIND, image.path), "ustack.objfile.function_child", [image.path],
                          niceness=NOTHING_WAITS_NICENESS, shared=True)
    return proc is not None


def running(path: str) -> bool:
    """Whether a child is building the functions of the object at `path`
    now."""
    return builders.running((_KIND, path))


def nothing_waits(path: str) -> None:
    """The run names the object at `path` without its child (a scan,
    objfile/symbol_scan.py): the child, building for the cache now, yields
    the CPU to the run."""
    builders.nothing_waits((_KIND, path), NOTHING_WAITS_NICENESS)
