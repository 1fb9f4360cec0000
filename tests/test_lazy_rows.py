"""Whole-machine runs with the in-kernel unwinder attach first and load
the unwind rows of objects as their code is sampled: a program busy before
the run still gets complete stacks (the first ones deferred to ustack),
and a program that never ran during the run has no rows built at all."""
from __future__ import annotations

import os
import re
import subprocess

import pytest

from helpers import (O2_NOFP, build, finish, parse_folded, popen_ustack, private_copy, stop,
                     ustack_env, wait_tracing)
from ustack.objfile.debuginfo import find_debug_file
from ustack.objfile.elf import ElfImage
from ustack.unwind import tables
from ustack.unwind.cfi_key import table_key

CHAIN = ["_start", "__libc_start_main", "__libc_start_call_main", "main", "work", "spin_here"]


@pytest.mark.kernel
def test_whole_machine_rows_load_as_sampled(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    busy = private_copy(build("busy", flags=O2_NOFP), tmp_path)     # no frame pointers
    idle = private_copy(build("parked"), tmp_path)
    # ahead of the machine's other work (a 2 s window at 99 Hz must hold
    # samples to judge, and a loaded machine or a parallel test run would
    # otherwise leave it a few)
    spinner = subprocess.Popen(["nice", "-n", "-10", str(busy), "600"])
    parked = subprocess.Popen([str(idle)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    us = popen_ustack("profile", "-F", "99", "-d", "2", "-P", "-f", "folded",
                      "--backend", "bpf", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True, env=dict(ustack_env(), USTACK_CACHE_DIR=str(cache)))
    try:
        header = wait_tracing(us, timeout=120)
        out, err = finish(us, timeout=900)
    finally:
        stop(us)
        stop(spinner)
        parked.stdin.close()
        stop(parked)
    assert us.returncode == 0, err
    assert "tables loaded as objects are sampled" in header, header
    mine = [(stack, n) for stack, n in parse_folded(out)
            if stack[0] == f"{busy.name}-{spinner.pid}"]
    total = sum(n for _s, n in mine)
    whole = sum(n for stack, n in mine if stack[1:7] == CHAIN)
    print(f"{whole} of {total} samples complete")
    assert total >= 20, out
    # one thread, 2 s at 99 Hz: the events stop on time (-d counts from when
    # they went live, before the machine's processes are read), however long the
    # cold run takes to build rows, and none of what they sent is dropped
    assert total <= 2 * 99 * 1.1, total
    assert "dropped unread" not in err, err
    assert whole >= 0.9 * total, mine
    # how many objects the run loaded, and how many it still wanted (the
    # busy program's at least, unless loaded: the loader takes the most
    # sampled first, and this machine's other programs may be sampled more)
    said = re.search(r"^Unwind rows of (\d+) objects were loaded during the run, as their "
                     r"code was sampled(?: \((\d+) more were wanted when it ended)?", err, re.M)
    assert said and int(said[1]) + int(said[2] or 0) >= 1, err
    # the parked program never ran: its rows were never built
    monkeypatch.setenv("USTACK_CACHE_DIR", str(cache))
    image = ElfImage.open(str(idle))
    never = tables.rows_file(tables.rows_key(
        table_key(image, os.stat(idle), find_debug_file(image)), tables.signals_key(image)))
    assert not os.path.exists(never), sorted(os.listdir(cache / "bpfrows"))


@pytest.mark.kernel
def test_a_pid_run_attaches_before_the_rows_it_must_build(tmp_path):
    """-p on a program whose rows the cache does not hold: the probes go
    live first, the rows are built and loaded after, and the stacks of
    the meantime (deferred, unwound by ustack) are as whole as the rest."""
    cache = tmp_path / "cache"
    busy = private_copy(build("busy", flags=O2_NOFP), tmp_path)     # rows never cached
    spinner = subprocess.Popen(["nice", "-n", "-10", str(busy), "600"])
    us = popen_ustack("profile", "-F", "99", "-d", "2", "-f", "folded", "--backend", "bpf",
                      "-p", str(spinner.pid), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True, env=dict(ustack_env(), USTACK_CACHE_DIR=str(cache)))
    try:
        wait_tracing(us, timeout=120)
        out, err = finish(us, timeout=900)
    finally:
        stop(us)
        stop(spinner)
    assert us.returncode == 0, err
    said = re.search(r"^Unwind rows of (\d+) objects were loaded during the run, built "
                     r"after the start", err, re.M)
    assert said and int(said[1]) >= 1, err
    mine = [(stack, n) for stack, n in parse_folded(out)]
    total = sum(n for _s, n in mine)
    whole = sum(n for stack, n in mine if stack[1:7] == CHAIN)
    print(f"{whole} of {total} samples complete")
    assert total >= 20, out
    assert whole >= 0.9 * total, mine


def test_the_loader_does_not_make_the_run_wait_for_rows():
    """The lazy loader asks for rows the run goes on without (tables'
    run_waits=False: a big object's builder runs niced), most wanted
    first."""
    from ustack.capture.lazy_rows import LazyRows, ObjectPaths

    class Objects:
        def __init__(self):
            self.loaded, self.asked = {}, []

        def wanted(self):          # as the WANTED map: what is not loaded yet
            return {k: n for k, n in {(1, 10): 3, (1, 20): 9}.items() if k not in self.loaded}

        def add_path(self, path, key, **how):
            self.asked.append((path, how))
            self.loaded[key] = path

    paths = ObjectPaths()
    paths.paths.update({(1, 10): "/a", (1, 20): "/b"})
    objects = Objects()
    loader = LazyRows(objects, paths)
    assert loader.load_next() and loader.load_next()
    assert objects.asked == [("/b", {"run_waits": False}), ("/a", {"run_waits": False})]


def test_the_start_waits_for_the_running_interpreters_cached_rows_only():
    """A whole-machine run goes live once the rows the cache holds of the
    running interpreters' objects are loaded (their stacks walked in the
    kernel, with their script frames, from the first sample), not once
    those it must build are: they are built after the start."""
    import threading

    from ustack.capture.lazy_rows import LazyRows, ObjectPaths
    from ustack.interrupt import Interrupt

    building = threading.Event()
    release = threading.Event()

    class Objects:
        def __init__(self):
            self.loaded, self.asked = {}, []

        def wanted(self):
            return {}

        def add_path(self, path, key=None, **how):
            self.asked.append((path, how))
            if path == "/cold":
                if how.get("cached_only"):
                    return False        # the cache does not hold its rows
                building.set()
                release.wait(30)
            self.loaded[path] = path
            return True

    objects = Objects()
    loader = LazyRows(objects, ObjectPaths(lambda: []), first=["/cold", "/libruby"])
    loader.start()
    try:
        loader.wait_first(Interrupt())
        assert "/libruby" in objects.loaded and "/cold" not in objects.loaded, objects.asked
        assert building.wait(30)
    finally:
        release.set()
        loader.stop()
    assert objects.asked[:3] == [("/cold", {"run_waits": False, "cached_only": True}),
                                 ("/libruby", {"run_waits": False, "cached_only": True}),
                                 ("/cold", {"run_waits": False, "cached_only": False})]
