"""Node: JS frames named from the perf map `node --perf-basic-prof`
writes, and the in-kernel walk through V8's builtins, which sit in node's
own text without CFI: walked on their frame pointer (with a note), so the
samples reach main and _start instead of ending at the first builtin."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers import run_ustack
from test_e2e_core import ok, parse_folded

pytestmark = pytest.mark.kernel

SPIN = Path(__file__).parent / "programs" / "js" / "spin.js"


@pytest.mark.parametrize("backend", ["auto", "perf"])
def test_js_samples_reach_start(backend, tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: no JS stacks to walk")
    out = tmp_path / "node.folded"
    res = ok(run_ustack("profile", "-F", "199", "-o", out, "--backend", backend,
                        "-c", f"{node} --perf-basic-prof {SPIN} 1500",
                        cwd=tmp_path))            # node writes its isolate logs there
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
