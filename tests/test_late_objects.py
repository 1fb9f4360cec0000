"""Objects ustack meets after it started: a library dlopen'd after the
attach and called at once, before ustack can have read its mapping, under
a stack deeper than the default 8 KiB copy (its events are unwound from
copies as deep as --stack-size); a container's objects (its own libc),
running since before a whole-machine run, probed at a high rate (their
rows load before the run starts); on tracefs, which reads maps from /proc,
a library mapped and gone before ustack read them. Whole stacks, or cut
with a note, never a bare frame."""
from __future__ import annotations

import signal
import subprocess

import pytest

from container import APP_PATH, Rootfs, Runtime
from helpers import (O2_NOFP, build, finish, funcs, parse_counts, parse_trace, run_attached,
                     run_ustack, spawn, start_ustack, stop, wait_tracing)

DEPTH = 100          # ~300 bytes a frame: ~30 KiB of stack under the plugin


@pytest.fixture(scope="module")
def deep_dlopen():
    return (build("dlopen_deep", flags=O2_NOFP),
            build("plugin_back", kind="shared", flags=O2_NOFP))


@pytest.mark.kernel
def test_events_in_a_library_dlopened_during_the_run_are_whole_as_deep_as_the_stack_size(
        deep_dlopen):
    prog, plugin = deep_dlopen
    target = spawn(prog, plugin, DEPTH, 3, "-", stdin=subprocess.PIPE)
    try:
        res = run_attached(target, "count", "--backend", "bpf", "--stack-size", "65528",
                           f"uprobe:{prog}:back", timeout=60)
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    assert res.returncode == 0, res.stderr
    stacks = parse_counts(res.stdout)
    assert sum(s["count"] for s in stacks) == 3, res.stdout
    chain = ([("back", "dlopen_deep"), ("plugin_back", "plugin_back.so"),
              ("call_plugin", "dlopen_deep")] + [("deep", "dlopen_deep")] * DEPTH
             + [("main", "dlopen_deep")])
    for s in stacks:
        assert s["frames"][:len(chain)] == chain, s["frames"][:8]
        assert s["frames"][-1][0] == "_start", s["frames"][-4:]
    assert "cut" not in res.stdout + res.stderr, res.stdout + res.stderr


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    rt = Runtime(Rootfs(tmp_path_factory.mktemp("ct")))
    print(f"container runtime used: {rt.name}")
    yield rt
    rt.close()


@pytest.mark.kernel
def test_a_container_running_before_a_whole_machine_run_has_whole_stacks(runtime):
    """--container-pid without -p: the whole machine, rows loaded as
    sampled; the processes that map the probed binary get theirs before
    the start, so 5,000 quick hits do not outrun the loader."""
    calls = 5000
    ct = runtime.start(calls)
    try:
        us = start_ustack("count", "-P", f"uprobe:{APP_PATH}:app_work", "--container-pid",
                          str(ct.host_pid), stdout=subprocess.PIPE)
        try:
            wait_tracing(us, timeout=60)
            ct.go()                          # returns once its calls are made
            us.send_signal(signal.SIGINT)
            out, err = finish(us, timeout=60)
        finally:
            stop(us)
    finally:
        ct.finish()
    assert us.returncode == 0, err
    mine = [s for s in parse_counts(out) if s["pid"] == ct.host_pid]
    assert sum(s["count"] for s in mine) == calls, out
    for s in mine:
        assert funcs(s["frames"]) == ["app_work", "main", "__libc_start_call_main",
                                      "__libc_start_main", "_start"], s
    assert "cut" not in err, err


@pytest.mark.kernel
def test_memleak_names_blocks_allocated_right_after_a_dlopen(deep_dlopen):
    """Each block is allocated through the library at once after its
    dlopen: the walk meets it without rows and defers the call; the
    report has every block under its whole stack."""
    from test_memleak import parse_reports
    prog, plugin = deep_dlopen
    calls = 5
    target = spawn(prog, plugin, 3, calls, "-", stdin=subprocess.PIPE)
    try:
        res = run_attached(target, "memleak", timeout=60)
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    assert res.returncode == 0, res.stderr
    (report,) = parse_reports(res.stdout)
    mine = [(frames, nbytes, blocks) for frames, nbytes, blocks in report if "back" in frames]
    assert mine == [(("malloc", "back", "plugin_back", "call_plugin", "deep", "deep", "deep",
                      "main", "__libc_start_call_main", "__libc_start_main", "_start"),
                     sum(64 + i for i in range(calls)), calls)], res.stdout


@pytest.mark.kernel
def test_tracefs_events_in_a_library_gone_before_its_maps_were_read_are_marked():
    """tracefs has no mapping records: ustack reads a process's maps from
    /proc when an event's address is outside what it read; a process that
    dlopens a library, calls it and exits at once is gone by then. Its
    events name the library, or say why they cannot."""
    prog, plugin = build("dlopen_main", flags=O2_NOFP), build(
        "plugin", kind="shared", flags=O2_NOFP)
    target = spawn(prog, "-", plugin, 3, stdin=subprocess.PIPE)
    try:
        res = run_attached(target, "trace", "--backend", "tracefs",
                           f"uprobe:{plugin}:plugin_leaf", timeout=60)
    finally:
        stop(target)
    assert res.returncode == 0, res.stderr
    events = parse_trace(res.stdout)
    assert len(events) == 3, res.stdout
    for e in events:
        named = e["frames"][0]["func"] == "plugin_leaf" and e["frames"][0]["module"] == "plugin.so"
        assert named or any("no mapping ustack saw" in n for n in e["notes"]), e


@pytest.mark.kernel
def test_a_stack_past_the_walks_frame_limit_is_whole_with_a_deep_copy():
    """200 frames: the in-kernel walk stops at 128; asked for 64 KiB of
    copy, the run unwinds the copy instead, to _start."""
    from helpers import RECURSE_FLAGS
    prog = build("recurse", flags=RECURSE_FLAGS)
    res = run_ustack("count", "--backend", "bpf", "--stack-size", "65528",
                     f"uprobe:{prog}:leaf", "-c", f"{prog} 200 3", timeout=60)
    assert res.returncode == 0, res.stderr
    (stack,) = parse_counts(res.stdout)
    assert stack["count"] == 3
    assert funcs(stack["frames"]) == ["leaf"] + ["rec"] * 200 + [
        "main", "__libc_start_call_main", "__libc_start_main", "_start"], stack["frames"][-6:]
