"""The unwinder's per-pc CFI through .eh_frame_hdr (unwind/cfi_index.py)
answers as the whole table does, at every FDE boundary and between them,
on the big objects this machine has; a run meets it only for a big object
whose whole table is not in memory."""
import os
import random
import shutil

import pytest

from helpers import build
from ustack.objfile.elf import ElfImage
from ustack.unwind.cfi import UnwindTable
from ustack.unwind.cfi_index import INDEXED_FROM, IndexedCfi, for_unwinder

OBJECTS = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
           "/usr/bin/bash",
           shutil.which("node") or "", "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so"]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    ElfImage.clear_cache()
    UnwindTable.clear_cache()


@pytest.mark.parametrize("path", OBJECTS, ids=os.path.basename)
def test_same_rows_as_the_whole_table(path):
    if not os.path.isfile(path):
        pytest.skip(f"{path or 'node'} is not installed")
    image = ElfImage.open(path)
    whole_built = []
    indexed = IndexedCfi.of_image(image, lambda: whole_built.append(1) or whole)
    whole = UnwindTable.for_image(image)[0]
    assert indexed is not None and len(indexed) > 1000
    pcs = set()
    step = max(1, len(whole.starts) // 5000)
    for start in whole.starts[::step]:
        pcs.update((start - 1, start, start + 1))
    rng = random.Random(7)
    pcs.update(rng.randrange(whole.starts[0] - 64, whole.starts[-1] + 64) for _ in range(5000))
    differ = [hex(pc) for pc in sorted(pcs) if indexed.lookup(pc) != whole.lookup(pc)]
    assert differ == [] and whole_built == []


def test_the_unwinder_indexes_only_big_objects_not_in_memory():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    big = ElfImage.open(node)
    assert big.file.sections[".eh_frame"][2] >= INDEXED_FROM
    table, _found = for_unwinder(big)
    assert isinstance(table, IndexedCfi)
    with_debug_file = ElfImage.open("/lib/x86_64-linux-gnu/libc.so.6")
    assert isinstance(for_unwinder(with_debug_file)[0], UnwindTable)
    # bash's 100 KB: a whole-machine run meets a shell's in most stacks it
    # unwinds in user space, and building its whole table cost 0.2-1 s there
    bash = ElfImage.open("/usr/bin/bash")
    assert bash.file.sections[".eh_frame"][2] >= INDEXED_FROM
    assert isinstance(for_unwinder(bash)[0], IndexedCfi)
    tiny = ElfImage.open(build("chain", flags=("-O0",)))
    assert isinstance(for_unwinder(tiny)[0], UnwindTable)
    whole = UnwindTable.for_image(big)[0]            # built by another path: in memory
    assert for_unwinder(big)[0] is whole
    UnwindTable.clear_cache()                        # on disk only: indexed again
    assert isinstance(for_unwinder(big)[0], IndexedCfi)


def test_big_objects_rows_are_built_by_a_child(tmp_path, monkeypatch):
    """node's in-kernel rows come from a child process (this one only
    reads its cache entry), the same rows this process would build."""
    from ustack.objfile import builders
    from ustack.unwind import tables
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    by_child = tables.for_image(ElfImage.open(node))
    assert by_child is not None and by_child.from_cache      # read back from the child's entry
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache2"))
    ElfImage.clear_cache()
    UnwindTable.clear_cache()
    monkeypatch.setattr(builders, "in_builder", True)     # as a builder does: here
    here = tables.for_image(ElfImage.open(node))
    assert not here.from_cache and here.data == by_child.data
