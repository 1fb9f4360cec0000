"""The function at an address while a child still builds an object's whole
function table (objfile/symbol_scan.py, ElfImage.function_at): the same
Symbol the whole table gives, for every shape of symbol table that decides
a name (aliases, nesting, overlaps, code labels, zero sizes, PLT stubs),
on real objects, and through ElfImage while node's child runs."""
from __future__ import annotations

import os
import random

import pytest

from helpers import build
from ustack.objfile import function_builder
from ustack.objfile.elf import ElfImage
from ustack.objfile.symbol_scan import SymbolScan

NODE = "/usr/bin/node"
LIBC_DEBUG_DIR = "/usr/lib/debug/.build-id"


# a cache of each test's own, its builders stopped after it (conftest.py)
pytestmark = pytest.mark.usefixtures("own_object_cache")


def addresses_to_ask(symbols: list, count: int, seed: int = 35) -> list:
    """Every start, end and their neighbours of `symbols` (at most `count`
    of them, chosen at random) and random addresses around them."""
    pick = random.Random(seed)
    at = set()
    for sym in symbols:
        at.update((sym.address - 1, sym.address, sym.address + 1,
                   sym.address + sym.size - 1, sym.address + sym.size))
    lo = min(s.address for s in symbols)
    hi = max(s.address + s.size for s in symbols)
    at.update(pick.randrange(lo - 64, hi + 64) for _ in range(count // 4))
    at = sorted(at)
    return sorted(pick.sample(at, count)) if len(at) > count else at


def names_alike(path: str, count: int) -> list:
    """The addresses where the scan and the whole table disagree."""
    whole = ElfImage.open(path).symbols
    scan = SymbolScan(path)
    return [hex(a) for a in addresses_to_ask(whole.functions, count)
            if scan.lookup(a) != whole.lookup(a)]


def test_every_shape_named_as_the_whole_table():
    prog = str(build("symbol_shapes", flags=("-O0",)))
    whole = ElfImage.open(prog).symbols
    names = {s.name for s in whole.functions}
    assert {"alias_global", "outer", "inner", "overlap_a", "unsized_one"} <= names
    # the shapes named as the whole table names them (checked, not assumed)
    by_name = {s.name: s for s in whole.functions}
    outer, inner = by_name["outer"].address, by_name["inner"].address
    assert whole.lookup(inner + 4).name == "inner"
    assert whole.lookup(outer + 20).name == "outer"       # the label inside is no owner
    assert whole.lookup(inner + 20).name == "outer"
    assert whole.lookup(outer + 100) is None    # past outer, in its last label's fill
    # one alias names an address, its own size its range: the global's 8 bytes
    alias = by_name["alias_global"].address
    assert whole.lookup(alias + 4).name == "alias_global"
    assert whole.lookup(alias + 40) is None
    assert names_alike(prog, 10_000) == []


@pytest.mark.parametrize("path", ["/usr/lib/x86_64-linux-gnu/libc.so.6",
                                  "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
                                  "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"])
def test_real_objects_named_as_the_whole_table(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed")
    assert names_alike(path, 3000) == []


def test_libc_debug_file_named_as_the_whole_table():
    libc = ElfImage.open("/usr/lib/x86_64-linux-gnu/libc.so.6")
    debug = os.path.join(LIBC_DEBUG_DIR, libc.file.build_id[:2], libc.file.build_id[2:] + ".debug")
    if not os.path.exists(debug):
        pytest.skip("libc6-dbg is not installed")
    assert names_alike(debug, 3000) == []


def test_node_named_while_its_child_builds():
    """A cold cache: opening node starts the child that builds its 86,000
    functions; function_at answers meanwhile, without waiting for it, as
    the whole table does once it is built."""
    if not os.path.exists(NODE):
        pytest.skip("node is not installed")
    image = ElfImage.open(NODE)
    assert function_builder.running(NODE)
    text, _offset, size = image.file.sections[".text"]
    pick = random.Random(35)
    asked = sorted(pick.randrange(text, text + size) for _ in range(1000))
    meanwhile = [image.function_at(a) for a in asked]
    if not function_builder.running(NODE):
        pytest.skip("node's child ended before the answers: the whole table may have given them")
    function_builder.wait(NODE)
    assert sum(sym is not None for sym in meanwhile) > 900
    assert meanwhile == [image.symbols.lookup(a) for a in asked]


def test_a_whole_machine_run_builds_middle_objects_functions_apart():
    """Named during a whole-machine run, a middle-sized object (libstdc++:
    5,500 entries) is named by a scan while the run's long-lived builder
    builds its whole table for the cache: this process builds none, and
    the names are the table's."""
    path = os.path.realpath("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed")
    function_builder.build_named_apart()
    try:
        image = ElfImage.open(path)
        assert image.symbols.pending
        image.function_at(0x1000)
        assert image.symbols.pending            # not built here
        function_builder.wait(path)
        ElfImage.clear_cache()
        parsed = ElfImage.parsed_files
        whole = ElfImage.open(path).symbols
        assert len(whole.functions) > 4000
        assert ElfImage.parsed_files == parsed  # the builder's cache entry, read back
        asked = addresses_to_ask(whole.functions, 2000)
        assert [hex(a) for a in asked if image.function_at(a) != whole.lookup(a)] == []
    finally:
        function_builder.build_named_apart(False)
