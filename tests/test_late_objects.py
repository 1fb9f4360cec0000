"""Objects that appear during a run: a library dlopen'd after the attach
and called at once, before ustack can have read its mapping, under a
stack deeper than the default 8 KiB copy. Its events are unwound from
copies as deep as --stack-size: whole, or cut with a note, never silently."""
from __future__ import annotations

import subprocess

import pytest

from helpers import O2_NOFP, build, parse_counts, run_attached, spawn, stop

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
