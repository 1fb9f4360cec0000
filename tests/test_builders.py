"""The run's long-lived rows builder (objfile/builders.py, shared=True):
the lazy row loader's objects go to one child, fed over a pipe, that
writes what the run reads back, leaves when idle, and leaves as Python
does on SIGTERM."""
import os
import shutil
import subprocess
import sys

import pytest

from helpers import catches_sigterm, ustack_env

from ustack.objfile import builders
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables
from ustack.unwind.cfi import UnwindTable

ROWS = "ustack.unwind.rows_builder"
# objects the unwinder looks up FDE by FDE (a big .eh_frame, no debug file here)
LIBSTDCXX = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
LIBCRYPTO = "/usr/lib/x86_64-linux-gnu/libcrypto.so.3"


# a cache of each test's own, its builders stopped after it (conftest.py)
pytestmark = pytest.mark.usefixtures("own_object_cache")


def objects(*paths) -> list:
    found = [os.path.realpath(p) for p in paths if os.path.isfile(p)]
    if len(found) < len(paths):
        pytest.skip(f"not installed: {set(paths) - set(found)}")
    return found


def test_one_builder_builds_the_rows_of_many_objects(monkeypatch):
    """Two objects' rows, one builder process; each read back from its
    cache entry equals what this process builds."""
    paths = objects(LIBSTDCXX, LIBCRYPTO)
    children = [builders.start(("rows", p, ()), ROWS, [p], shared=True) for p in paths]
    assert children[0] is not None and children[0].pid == children[1].pid
    for p in paths:
        builders.wait(("rows", p, ()))
        assert not builders.running(("rows", p, ()))
    by_builder = [tables.for_image(ElfImage.open(p)) for p in paths]
    assert all(packed is not None and packed.from_cache for packed in by_builder)
    # with nothing more to build it leaves by itself
    assert children[0].wait(timeout=30) == 0
    monkeypatch.setenv("USTACK_CACHE_DIR", os.environ["USTACK_CACHE_DIR"] + "2")
    ElfImage.clear_cache()
    UnwindTable.clear_cache()
    monkeypatch.setattr(builders, "in_builder", True)     # as a builder does: here
    here = [tables.for_image(ElfImage.open(p)) for p in paths]
    assert [p.data for p in here] == [p.data for p in by_builder]


def test_the_loaders_objects_go_to_one_builder():
    """What the lazy row loader asks (run_waits=False) of an object the
    unwinder looks up FDE by FDE is built apart, by one builder for all."""
    paths = objects(LIBSTDCXX, LIBCRYPTO)
    for p in paths:
        packed = tables.for_image(ElfImage.open(p), run_waits=False)
        assert packed is not None and packed.from_cache     # read back: built apart
    pids = {builders.start(("rows", p, ()), ROWS, [p], shared=True).pid for p in paths}
    assert len(pids) == 1


def test_a_stopped_builder_leaves_its_cache_whole(tmp_path):
    """SIGTERM while it has node's rows to build ends the long-lived
    builder as Python does: no cache file left under its temporary name,
    and the run's wait for it ends."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    node = os.path.realpath(node)
    key = ("rows", node, ())
    child = builders.start(key, ROWS, [node], shared=True)
    while child.poll() is None and not catches_sigterm(child.pid):
        pass                                    # its own ready signal: the handler set
    child.terminate()
    assert child.wait(timeout=30) == 1          # not -SIGTERM: it left as Python does
    builders.wait(key)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.name.endswith(".tmp")]


def test_a_run_with_no_builder_ends_without_importing_subprocess():
    """Every run's end stops the builders it did not need: with none
    started, that costs no import of subprocess (~2-3 ms of a one-hit
    trace's CPU)."""
    code = ("import sys; from ustack.objfile import builders; "
            "builders.stop_unneeded(); builders.stop_all(); "
            "print('subprocess' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], env=ustack_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.stdout == "False\n", res.stdout + res.stderr
