"""Node: JS frames named from the perf map `node --perf-basic-prof`
writes (with --no-js: else the in-kernel walk names them from node's heap,
tests/test_v8_frames.py), and the in-kernel walk through V8's builtins, which sit in node's
own text without CFI: walked on their frame pointer (with a note), so the
samples reach main and _start instead of ending at the first builtin.
chain.js's outer() -> middle() -> leaf() is the oracle of the JS chain:
each sample in leaf() must show the three, in order, down to _start."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import ustack
from helpers import ok, parse_folded, run_ustack

pytestmark = pytest.mark.kernel

JS = Path(__file__).parent / "programs" / "js"
SPIN = JS / "spin.js"
CHAIN = JS / "chain.js"
# V8 names a function `JS:` + its tier (* optimized, ^ baseline, ~ interpreted)
# + its name and place: "JS:*leaf /path/chain.js:3:15"
_JS_NAME = re.compile(r"JS:[*^~+-]?(\w*) (\S+):\d+:\d+$")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: no JS stacks to walk")
    return node


@pytest.mark.parametrize("backend", ["auto", "perf"])
def test_js_samples_reach_start(backend, tmp_path):
    node = _node()
    out = tmp_path / "node.folded"
    res = ok(run_ustack("profile", "-F", "199", "-o", out, "--backend", backend, "--no-js",
                        "-c", f"{node} --perf-basic-prof {SPIN} 1500",
                        cwd=tmp_path))            # node writes its isolate logs there
    _perf_map(res.stderr).unlink()
    if backend == "auto":
        assert "unwound in the kernel" in res.stderr.splitlines()[0], res.stderr
    js = [(stack, n) for stack, n in parse_folded(out.read_text())
          if any(f.startswith("JS:") for f in stack)]
    samples = sum(n for _s, n in js)
    rooted = sum(n for stack, n in js if "_start" in stack)
    assert samples >= 100, out.read_text()[-2000:]
    assert rooted >= 0.9 * samples, f"{rooted} of {samples} JS samples reach _start"
    hot = [s for s, _n in js if any(f.startswith("JS:*inner") or f.startswith("JS:inner")
                                    for f in s)]
    assert hot, "inner() was never named from the perf map"
    assert "ran JIT code but wrote no perf map" not in res.stderr


def _perf_map(stderr: str) -> Path:
    """The perf map of the -c command whose run printed `stderr`."""
    return Path(f"/tmp/perf-{_pid(stderr)}.map")


def _pid(stderr: str) -> int:
    return int(re.search(r"\(PID (\d+)\)", stderr.splitlines()[0])[1])


def _chain_of(frames) -> list:
    """chain.js's functions among the frames, outermost first (not its
    top level, which has no name)."""
    names = []
    for f in reversed(frames):
        m = _JS_NAME.match(f.function or "")
        if m and m[1] and m[2] == str(CHAIN):
            names.append(m[1])
    return names


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_js_chain_complete_and_in_order(backend, tmp_path, monkeypatch):
    """--interpreted-frames-native-stack names interpreted frames too (else
    they are V8's Builtins_InterpreterEntryTrampoline), --no-turbo-inlining
    keeps each function a frame of its own (an inlined call has none)."""
    node = _node()
    monkeypatch.chdir(tmp_path)                   # node writes its isolate logs here
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend=backend,
                          js=False,
                          cmdline=f"{node} --perf-basic-prof --interpreted-frames-native-stack"
                                  f" --no-turbo-inlining {CHAIN} 2000")
    run = ustack.Session(opts)
    try:
        with run:
            counted = run.counts()
            warnings = run.warnings
    finally:
        if run.target is not None:
            Path(f"/tmp/perf-{run.target.pid}.map").unlink(missing_ok=True)
    js = [c for c in counted if any(f.kind == "js" for f in c.stack.frames)]
    samples = sum(c.count for c in js)
    rooted = sum(c.count for c in js if c.stack.frames[-1].function == "_start")
    assert samples >= 100, counted
    assert rooted >= 0.9 * samples, f"{rooted} of {samples} JS samples reach _start"
    busy = [c for c in js if "leaf" in _chain_of(c.stack.frames)]
    whole = sum(c.count for c in busy if _chain_of(c.stack.frames) == ["outer", "middle", "leaf"]
                and c.stack.frames[-1].function == "_start")
    in_leaf = sum(c.count for c in busy)
    assert in_leaf >= 50 and whole >= 0.9 * in_leaf, \
        f"{whole} of {in_leaf} samples in leaf() show outer, middle, leaf down to _start"
    named = [f for c in js for f in c.stack.frames if f.module == "JIT"]
    assert {f.kind for f in named} == {"js"}, {(f.function, f.kind) for f in named}
    # outer() is called by the script's own (interpreted) top level, named too
    top = [f.function for c in busy for f in c.stack.frames
           if f.function and f.function.startswith(f"JS:~ {CHAIN}:")]
    assert top, "the script's interpreted top level is not named"
    assert not [w for w in warnings if "perf map" in w], warnings


def test_no_perf_map_is_said_once(tmp_path):
    """node without --perf-basic-prof: its JIT frames are unnamed, and the
    end of the run says why and what to do, once, even when an earlier
    process with node's pid left a /tmp/perf-PID.map (this suite's other
    node runs write them, and pids are reused)."""
    node = _node()
    res = ok(run_ustack("profile", "-F", "199", "-o", tmp_path / "out.folded", "--no-js",
                        "-c", f"{node} {SPIN} 1500", cwd=tmp_path))
    pid = _pid(res.stderr)
    said = [line for line in res.stderr.splitlines() if "perf map" in line]
    assert said == [
        f"ustack: PID {pid} (node) ran JIT code but wrote no perf map "
        f"(/tmp/perf-{pid}.map): its JIT frames are unnamed; run node with "
        f"--perf-basic-prof (and --interpreted-frames-native-stack to name "
        f"interpreted functions too)"], res.stderr
