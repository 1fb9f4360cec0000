"""ElfImage facts are kept on disk by file identity: a file seen before is
read back (no pyelftools), a rewritten file is parsed again, and a cache
file that someone else could have written is not believed."""
import glob
import os
import shutil

import pytest

from helpers import FP, build, catches_sigterm

from ustack.objfile import cache as objcache
from ustack.objfile.elf import ElfImage


# a cache of each test's own, its builders stopped after it (conftest.py)
pytestmark = pytest.mark.usefixtures("own_object_cache")


def facts(image):
    return (image.build_id, image.e_type, image.sections, image.segments(),
            image.functions, [image.lookup(s.address + 1) for s in image.functions],
            [image.is_ifunc(s) for s in image.functions],
            [image.is_compat(s) for s in image.functions])


def test_second_open_reads_the_cache(tmp_path):
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    parsed = ElfImage.parsed_files
    first = facts(ElfImage.open(str(prog)))
    assert ElfImage.parsed_files == parsed + 1
    ElfImage.clear_cache()
    assert facts(ElfImage.open(str(prog))) == first
    assert ElfImage.parsed_files == parsed + 1


def test_layout_read_back_when_no_function_was_asked(tmp_path):
    """An object whose functions nobody asked (ld.so in most runs) is not
    parsed again by the next open; its functions are still there."""
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    parsed = ElfImage.parsed_files
    first = ElfImage.open(str(prog))
    layout = (first.build_id, first.sections, first.segments())
    assert ElfImage.parsed_files == parsed + 1
    ElfImage.clear_cache()
    again = ElfImage.open(str(prog))
    assert ElfImage.parsed_files == parsed + 1
    assert (again.build_id, again.sections, again.segments()) == layout
    assert [s.name for s in again.find("d")] == ["d"]


def test_libc_read_back_the_same(tmp_path):
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    first = facts(ElfImage.open(libc))
    ElfImage.clear_cache()
    parsed = ElfImage.parsed_files
    again = ElfImage.open(libc)
    assert ElfImage.parsed_files == parsed
    assert facts(again) == first
    assert [s.name for s in again.find("strlen")] == ["strlen"]
    assert again.is_ifunc(again.find("strlen")[0])


def test_rewritten_file_is_parsed_again(tmp_path):
    prog = tmp_path / "prog"
    shutil.copy(build("chain", flags=FP), prog)
    ElfImage.open(str(prog)).symbols.functions   # the cache is written with them
    st = prog.stat()
    # another program at the same path, its mtime set back to the old one
    shutil.copy(build("recurse", flags=FP), prog)
    os.utime(prog, ns=(st.st_atime_ns, st.st_mtime_ns))
    ElfImage.clear_cache()
    parsed = ElfImage.parsed_files
    image = ElfImage.open(str(prog))
    assert ElfImage.parsed_files == parsed + 1
    assert image.find("d") == [] and image.find("main")


def test_cache_writable_by_others_is_not_read(tmp_path):
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    ElfImage.open(str(prog)).symbols.functions
    (cached,) = (tmp_path / "cache" / "images").iterdir()
    assert oct(cached.stat().st_mode & 0o777) == "0o600"
    cached.write_bytes(cached.read_bytes().replace(b'"main"', b'"forged"'))
    cached.chmod(0o666)
    ElfImage.clear_cache()
    parsed = ElfImage.parsed_files
    image = ElfImage.open(str(prog))
    assert ElfImage.parsed_files == parsed + 1
    assert image.find("main") and not image.find("forged")


def test_same_file_by_another_path_reads_the_cache(tmp_path):
    """A file seen through a link (or /proc/PID/root/…) is the same file:
    one cache entry, not one per path."""
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    first = facts(ElfImage.open(str(prog)))
    link = tmp_path / "link"
    link.symlink_to(prog)
    parsed = ElfImage.parsed_files
    ElfImage.clear_cache()
    assert facts(ElfImage.open(str(link))) == first
    assert ElfImage.parsed_files == parsed
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1


def chain_cached_then_damaged(tmp_path, part: int, damage) -> tuple:
    """(path, facts) of a copy of chain opened once, after which part `part`
    of its image cache entry (0 layout, 1 symbols, 2 address table, one
    line each but the table) was replaced by damage(part), the entry's
    checksum made to match (what a reader of the format meets: a damage
    the checksum sees is the whole entry parsed again at once)."""
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    first = facts(ElfImage.open(str(prog)))
    [cached] = [p for p in (tmp_path / "cache").rglob("*.json") if "images" in p.parts]
    layout, _, rest = objcache.read(str(cached)).partition(b"\n")
    parts = [layout, *rest.partition(b"\n")[::2]]
    parts[part] = damage(parts[part])
    objcache.write(str(cached), b"\n".join(parts))
    ElfImage.clear_cache()
    return prog, first


def test_damaged_symbols_in_the_cache_are_parsed_again(tmp_path):
    """The cache's symbols part is decoded only when symbols are asked for;
    damaged, the file is parsed again then, and the answers are the same."""
    prog, first = chain_cached_then_damaged(tmp_path, 1, lambda _: b'{"named": [[')
    parsed = ElfImage.parsed_files
    image = ElfImage.open(str(prog))
    assert ElfImage.parsed_files == parsed          # the layout half was believed
    assert facts(image) == first
    assert ElfImage.parsed_files == parsed + 1      # the symbols were parsed again


@pytest.mark.parametrize("damage", [lambda table: table[:-3], lambda table: table[:12],
                                    lambda table: b"\xff" * len(table),
                                    lambda table: table[:-1] + b"\x80"],
                         ids=["cut short", "header only", "overwritten", "a name not UTF-8"])
def test_damaged_address_table_in_the_cache_is_parsed_again(tmp_path, damage):
    """The cache's third part, the packed table lookup() reads: damaged,
    the file is parsed again when an address is first named, with the
    same answers."""
    prog, first = chain_cached_then_damaged(tmp_path, 2, damage)
    parsed = ElfImage.parsed_files
    image = ElfImage.open(str(prog))
    d = image.find("d")[0]
    assert image.lookup(d.address + 1) == d
    assert ElfImage.parsed_files == parsed + 1      # the table was not believed
    assert facts(image) == first


def through_both_readers(paths: list, read, tmp_path, monkeypatch) -> dict:
    """{reader: {basename: read(path)}} with each reader ElfImage has:
    libelf, then pyelftools (as where libelf.so.1 is missing), each with a
    cache of its own."""
    from ustack.native import libelf
    got = {}
    for reader in ("libelf", "pyelftools"):
        monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / reader))
        if reader == "pyelftools":
            monkeypatch.setattr(libelf, "available", lambda: False)
        ElfImage.clear_cache()
        got[reader] = {os.path.basename(p): read(p) for p in paths}
    return got


def test_libelf_and_pyelftools_read_the_same(tmp_path, monkeypatch):
    """The system's libraries (IFUNCs, symbol versions, PLT stubs) and
    libc's debug file give the same facts read through libelf as through
    pyelftools, what ustack uses without libelf.so.1."""
    from ustack.native import libelf
    from ustack.objfile.debuginfo import find_debug_file
    if not libelf.available():
        pytest.skip("libelf.so.1 is not installed (apt-get install libelf1)")
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    paths = [libc, "/lib64/ld-linux-x86-64.so.2", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"]
    debug = find_debug_file(ElfImage.open(libc))
    if debug.how == "build-id":
        paths.append(debug.path)
    paths = [p for p in paths if os.path.exists(p)]
    parsed = []

    def read(path):
        parsed.append(ElfImage.parsed_files)
        return facts(ElfImage.open(path))
    got = through_both_readers(paths, read, tmp_path, monkeypatch)
    assert ElfImage.parsed_files == parsed[0] + 2 * len(paths)   # none from a cache
    assert got["libelf"] == got["pyelftools"]
    assert any(ElfImage.open(libc).is_ifunc(s) for s in ElfImage.open(libc).functions)


def test_other_classes_and_byte_orders_read_the_same(tmp_path, monkeypatch):
    """32-bit, big-endian and relocatable files (Go's debug/elf test files:
    i386, ARM, MIPS, PowerPC, s390x, SPARC, RISC-V) give the same facts
    through libelf as through pyelftools, or the same error."""
    from ustack.native import libelf
    from ustack.model import UstackError
    found = sorted(glob.glob("/usr/lib/go*/src/debug/elf/testdata/*"))
    if not found or not libelf.available():
        pytest.skip("Go's debug/elf test files (golang-go) or libelf.so.1 are not installed")

    def read(path):
        try:
            image = ElfImage.open(path)
        except UstackError:
            return "error"
        return (image.machine, image.little_endian, image.elfclass, *facts(image))
    got = through_both_readers(found, read, tmp_path, monkeypatch)
    assert got["libelf"] == got["pyelftools"]
    kinds = {(r[1], r[2]) for r in got["libelf"].values() if r != "error"}
    assert {(True, 32), (False, 32), (False, 64), (True, 64)} <= kinds


def test_functions_are_built_only_when_asked(tmp_path):
    """Unwinding through an object reads its layout and CFI, not its
    functions (node's take a second): they are built, and the image cache
    written, when a frame is first named."""
    from ustack.unwind.cfi import UnwindTable
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    image = ElfImage.open(str(prog))
    assert len(UnwindTable.for_image(image)[0]) > 10
    assert not (tmp_path / "cache" / "images").exists()
    (d,) = image.find("d")
    assert image.lookup(d.address + 1) == d
    assert len(list((tmp_path / "cache" / "images").iterdir())) == 1
    ElfImage.clear_cache()
    assert facts(ElfImage.open(str(prog))) == facts(image)


def test_big_symbol_tables_are_built_by_a_child(tmp_path, monkeypatch):
    """node's 86,000 functions are parsed by a child process while the run
    goes on; what this process then reads equals what it would build."""
    from ustack.objfile import builders, function_builder
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    image = ElfImage.open(node)
    child = function_builder.start(image)
    assert child is not None and function_builder.start(image) is child
    by_child = facts(image)
    assert child.returncode == 0
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache2"))
    ElfImage.clear_cache()
    here = ElfImage.open(node)
    assert function_builder.worth_a_child(here)
    assert facts(here) == by_child
    builders.stop_all()


def test_builders_are_killed_when_the_run_ends(tmp_path):
    from ustack.objfile import builders, function_builder
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    child = function_builder.start(ElfImage.open(node))
    builders.stop_all()
    assert child.poll() is not None
    assert function_builder.start(ElfImage.open(node)) is not child
    builders.stop_all()


def test_each_cache_directory_and_each_emptied_cache_gets_its_own_builder(tmp_path,
                                                                          monkeypatch):
    """A long-lived API user: node opened for one cache while its builder
    for another still runs, then again once the cache was emptied after
    its builder ended: each time a child builds the functions into the
    cache in use, before they are asked for."""
    from ustack.objfile import function_builder
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    node = os.path.realpath(node)
    ElfImage.open(node)                         # its builder for the first cache
    other = tmp_path / "other"
    monkeypatch.setenv("USTACK_CACHE_DIR", str(other))
    for _ in range(2):
        ElfImage.clear_cache()
        ElfImage.open(node)
        function_builder.wait(node)
        images = other / "images"
        assert images.is_dir() and any(images.iterdir())    # the child wrote them
        shutil.rmtree(other)


def test_a_stopped_builder_leaves_as_python_does(tmp_path):
    """SIGTERM (stop_all) ends a builder through SystemExit, so a cache
    file it was writing is removed (output.write_bytes_at), not left
    under its temporary name; SIGKILL only when it does not leave."""
    from ustack.objfile import builders, function_builder
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    child = function_builder.start(ElfImage.open(node))
    while child.poll() is None and not catches_sigterm(child.pid):
        pass                                    # its own ready signal: the handler set
    child.terminate()
    assert child.wait(timeout=30) == 1          # not -SIGTERM: it left as Python does
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]
    builders.stop_all()


def waits_on_lock(pid: int, path: str) -> bool:
    """Whether process `pid` is blocked on a flock of the file at `path`
    (/proc/locks lists a waiter as '-> FLOCK ... PID MAJ:MIN:INODE')."""
    inode = f":{os.stat(path).st_ino} "
    with open("/proc/locks") as f:
        return any("->" in line and f" {pid} " in line and inode in line for line in f)


def test_a_builder_waits_for_another_runs_builder_of_the_same_object(tmp_path):
    """Runs one after another on a busy machine: the last run's builder of
    an object may still be finishing. The next run's builder of it waits
    for that one's lock (then finds the entry built), not beside it."""
    from ustack.objfile import builder_child, builders, function_builder
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    name = builder_child.lock_name(("functions", node))
    other_run = objcache.hold(name)             # as that other builder holds it
    try:
        child = function_builder.start(ElfImage.open(node))
        while child.poll() is None and not waits_on_lock(child.pid, objcache.lock_path(name)):
            pass
        assert child.poll() is None             # waiting for its turn, not done
    finally:
        os.close(other_run)
    assert child.wait(timeout=60) == 0
    builders.stop_all()


def test_a_builder_nothing_waits_for_yields_the_cpu(tmp_path):
    """A whole-machine run's rows builder (its lazy loader's) runs at a
    niceness of its own; this process keeps its own."""
    from ustack.objfile import builders
    from ustack.unwind.tables import BACKGROUND_NICENESS
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    child = builders.start(("rows", node, ()), "ustack.unwind.rows_builder", [node],
                           niceness=BACKGROUND_NICENESS)
    try:
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == mine + BACKGROUND_NICENESS
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine
    finally:
        builders.stop_all()


def test_a_big_symbol_list_is_read_again_when_asked(tmp_path):
    """node's symbol list (12 MB in the cache) is not held while frames are
    named from the address table; asked for, it is read again, and parsed
    anew if the cache entry went away meanwhile."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    main = ElfImage.open(node).find("main")
    ElfImage.clear_cache()
    image = ElfImage.open(node)
    assert image.lookup(main[0].address + 1) == main[0]
    assert image.find("main") == main                       # read again
    ElfImage.clear_cache()
    image = ElfImage.open(node)
    for cached in (tmp_path / "cache" / "images").iterdir():
        cached.unlink()
    assert image.find("main") == main                       # parsed anew


def test_a_damaged_entry_met_when_functions_are_first_asked_is_parsed_again(tmp_path):
    """An entry that appears between open() and the first question (a
    builder child writes it) with an unreadable symbol list: the file is
    parsed anew, once."""
    from ustack.objfile import elf_state
    prog = tmp_path / "chain"
    shutil.copy(build("chain", flags=FP), prog)
    good = ElfImage.open(str(prog)).find("main")
    ElfImage.clear_cache()
    for cached in (tmp_path / "cache" / "images").iterdir():
        layout, _symbols, lookup = objcache.read(str(cached)).split(b"\n", 2)
        cached.unlink()
    image = ElfImage.open(str(prog))            # nothing cached: functions deferred
    entry = objcache.identity_file("images", prog.stat(), f"{elf_state.STATE_VERSION}.json")
    objcache.write(entry, b"\n".join([layout, b'{"named": 7}', lookup]))
    parsed = ElfImage.parsed_files
    assert image.find("main") == good
    assert ElfImage.parsed_files == parsed + 1
