"""Damaged objects through list, list -v, trace by name and symbolize:
how many of N (default 1000) damaged copies of tests/test_fuzz.py's three
objects (a C program with DWARF, a library with USDT notes, a Go program
with DWARF) made any of the four commands print a traceback or fail
without a one-line `ustack: …` error. Every case runs to the end (the
test stops at the first). Writes bench/results/damaged_objects.md.

  python3 bench/damaged_objects.py [N] [SEED]

The same draws as `USTACK_FUZZ_OBJECTS=N USTACK_FUZZ_SEED=SEED pytest
tests/test_fuzz.py -k damaged_objects`."""
from __future__ import annotations

import collections
import contextlib
import io
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]
os.environ["USTACK_CACHE_DIR"] = "/dev/null/ustack-bench-cache"    # parse every copy


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed = sys.argv[2] if len(sys.argv) > 2 else "14"
    os.environ["USTACK_FUZZ_SEED"] = seed
    import test_fuzz as fuzz
    from helpers import O2_NOFP, build, build_go
    from ustack import cli
    from ustack.model import UstackError
    import ustack.session
    from ustack.target import process

    def resolved(*args, **kw):
        raise UstackError("resolved")           # trace ends once its probes are resolved
    process.launch = process.everything = ustack.session.launch_traced = resolved

    objects = [(build("args", flags=O2_NOFP), "mix", "buf"),
               (build("usdt_lib", flags=O2_NOFP, kind="shared"), "", ""),
               (build_go("goargs"), "main.work", "count")]
    objects = [(p, p.read_bytes(), f, a) for p, f, a in objects]
    r = fuzz.rng("objects")
    bad = collections.Counter()
    runs = collections.Counter()
    examples: dict = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ustack-damaged-") as tmp:
        tmp = Path(tmp)
        trace = tmp / "trace.txt"
        for i in range(n):
            path, data, func, arg = objects[i % len(objects)]
            copy = fuzz.write_copy(tmp, "obj", fuzz.damaged_object(r, path, data))
            commands = [("list", ["list", copy]),
                        ("list -v", ["list", "-v", copy, *([func] if func and i % 2 else [])])]
            if func:
                commands.append(("trace by name",
                                 ["trace", "-c", "/bin/true", f"uprobe:{copy}:{func} {arg}"]))
            trace.write_text(f" => {copy}[+0x{r.randrange(0x1000, 0x2000):x}]\n")
            commands.append(("symbolize", ["symbolize", trace, "--binary", copy, "--lines",
                                           "--inlines"]))
            for what, argv in commands:
                runs[what] += 1
                err = io.StringIO()
                out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape")
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    try:
                        status = cli.main([str(a) for a in argv])
                    except Exception:
                        status = "traceback"
                        err.write(traceback.format_exc())
                lines = err.getvalue().splitlines()
                if status == "traceback" or "Traceback" in err.getvalue() or (
                        status not in (0, None)
                        and not all(l.startswith("ustack: ") for l in lines)):
                    bad[what] += 1
                    examples.setdefault(what, (i, lines[-1] if lines else ""))
    seconds = time.monotonic() - started
    rows = "\n".join(f"| {w} | {runs[w]} | {bad[w]} |" for w in runs)
    text = (f"# Damaged objects: list, list -v, trace by name, symbolize\n\n"
            f"`python3 bench/damaged_objects.py {n} {seed}`: {n} damaged objects "
            f"(seed {seed}), {sum(runs.values())} commands in {seconds:.0f} s.\n\n"
            f"| command | runs | traceback or not one line |\n|---|---:|---:|\n{rows}\n")
    for what, (i, line) in examples.items():
        text += f"\nobject {i}, {what}: {line}\n"
    out_path = ROOT / "bench" / "results" / "damaged_objects.md"
    out_path.write_text(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
