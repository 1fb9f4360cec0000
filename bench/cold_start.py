#!/usr/bin/env python3
"""Cold starts on big programs: how long `ustack profile` takes from its
launch to its `Tracing` line (the probes live: every sample from then on
is kept), and to its end, with ustack's cache directory emptied AND the
page cache dropped (echo 3 > /proc/sys/vm/drop_caches) before each run:
  - `profile -p` of clang++-14 -O2 on bench/big_objects.py's template-heavy
    file (libLLVM-14, libclang-cpp-14), of node spinning, of a headless
    chromium renderer spinning in JS;
  - `profile -p PID -d 2` of node against `perf record -g -p PID -- sleep 2`
    followed by `perf script` (the wall time of both together);
  - `profile -d 2` of the whole machine against `perf record -a -g -- sleep
    2` + `perf script`, while clang++, node and chromium run.
Runs alternate (this tree, the other tree if --before DIR, perf); ratios
are taken pair by pair, then the median.

    sudo python3 bench/cold_start.py [--reps N] [--before DIR/src]

Prints Markdown and writes bench/results/cold_start.md."""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from big_objects import CLANG, SOURCE  # noqa: E402

HZ = "299"
NODE_SPIN = ("console.log('ready');"
             "let s = 0; for (;;) { for (let i = 0; i < 1e6; i++) s += Math.sqrt(i) }")
PAGE = """<html><body><script>
function spin() { let s = 0; for (let i = 0; i < 2e6; i++) s += Math.sqrt(i);
                  document.title = s; setTimeout(spin, 0); }
spin();
</script></body></html>"""


def cold(cache_root: Path) -> Path:
    """An empty cache directory, and the page cache dropped."""
    cache = Path(tempfile.mkdtemp(prefix="cache", dir=cache_root))
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")
    return cache


def maps_has(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def wait_for(what, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = what()
        if found:
            return found
        time.sleep(0.01)
    raise SystemExit("timed out waiting for a target to be ready")


class Targets:
    """The programs profiled: started once, ended by close()."""

    def __init__(self, work: Path):
        self.work = work
        self.procs: list = []
        (work / "heavy.cpp").write_text(SOURCE)
        (work / "page.html").write_text(PAGE)

    def clang(self) -> int:
        """A clang++ compile, once it maps libclang-cpp (restarted as it ends)."""
        p = subprocess.Popen([CLANG, "-O2", "-std=c++17", "-c", str(self.work / "heavy.cpp"),
                              "-o", "/dev/null"])
        self.procs.append(p)
        wait_for(lambda: maps_has(p.pid, "libclang-cpp"))
        return p.pid

    def node(self) -> int:
        p = subprocess.Popen(["node", "-e", NODE_SPIN], stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        p.stdout.readline()
        return p.pid

    def chromium(self) -> int:
        """The renderer of a headless chromium showing a spinning page."""
        p = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                              f"--user-data-dir={self.work / 'chromium'}",
                              "--remote-debugging-port=0",
                              f"file://{self.work / 'page.html'}"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self.procs.append(p)

        def renderer():
            for pid in os.listdir("/proc"):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"--type=renderer" in cmd and str(self.work).encode() in cmd:
                    return int(pid)
            return None
        pid = wait_for(renderer)
        time.sleep(1.0)         # its page loaded and spinning
        return pid

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL) if p.args[0] == "chromium" else p.kill()
            except OSError:
                pass
            p.wait()
        self.procs.clear()


def ustack_run(src: str, cache: Path, args: list, out: Path) -> tuple:
    """(seconds to the Tracing line, seconds to the end) of one run."""
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.monotonic()
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", HZ, "-d", "2",
                           "-o", str(out), *args], env=env, stderr=subprocess.PIPE, text=True)
    line = us.stderr.readline()
    tracing = time.monotonic() - start
    rest = us.stderr.read()
    us.wait()
    took = time.monotonic() - start
    if not line.startswith("Tracing") or us.returncode != 0:
        raise SystemExit(f"ustack failed: {line}{rest}")
    return tracing, took


def perf_run(work: Path, args: list) -> float:
    """Seconds of `perf record -g ... -- sleep 2` then `perf script`."""
    data = work / "perf.data"
    start = time.monotonic()
    subprocess.run(["perf", "record", "-q", "-g", "-F", HZ, "-o", str(data), *args,
                    "--", "sleep", "2"], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    subprocess.run(["perf", "script", "-i", str(data)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def median(values: list) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


def spread(values: list) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", help="another tree's src/ (e.g. git archive main src)")
    ap.add_argument("--skip", nargs="*", default=(), help="parts to skip: p node machine")
    a = ap.parse_args()
    trees = [("this tree", str(REPO / "src"))] + ([("before", a.before)] if a.before else [])
    work = Path(tempfile.mkdtemp(prefix="cold_start"))
    caches = work / "caches"
    caches.mkdir()
    rows = []
    try:
        if "p" not in a.skip:
            for name in ("clang", "node", "chromium"):
                results = {t: ([], []) for t, _ in trees}
                for _rep in range(a.reps):
                    for tree, src in trees:
                        targets = Targets(work)
                        try:
                            pid = getattr(targets, name)()
                            tracing, took = ustack_run(src, cold(caches), ["-p", str(pid)],
                                                       work / "out.folded")
                        finally:
                            targets.close()
                        results[tree][0].append(tracing)
                        results[tree][1].append(took)
                        print(name, tree, f"{tracing:.2f} {took:.2f}", file=sys.stderr)
                for tree, (tr, took) in results.items():
                    rows.append(f"| `profile -p` {name} | {tree} | {median(tr)} ({spread(tr)}) "
                                f"| {median(took)} ({spread(took)}) | |")
        for part, args, perf_args, needs in (
                ("node", lambda pid: ["-p", str(pid)], lambda pid: ["-p", str(pid)], ("node",)),
                ("machine", lambda pid: [], lambda pid: ["-a"], ("clang", "node", "chromium"))):
            if part in a.skip:
                continue
            results = {t: [] for t, _ in trees}
            tracings = {t: [] for t, _ in trees}
            perfs, ratios = [], []
            for _rep in range(a.reps):
                targets = Targets(work)
                try:
                    pids = [getattr(targets, n)() for n in needs]
                    for tree, src in trees:
                        tracing, took = ustack_run(src, cold(caches), args(pids[-1]),
                                                   work / "out.folded")
                        results[tree].append(took)
                        tracings[tree].append(tracing)
                        cold(caches)
                        p = perf_run(work, perf_args(pids[-1]))
                        if tree == trees[0][0]:
                            perfs.append(p)
                            ratios.append(took / p)
                        print(part, tree, f"{tracing:.2f} {took:.2f} perf {p:.2f}",
                              file=sys.stderr)
                finally:
                    targets.close()
            what = "`profile -p -d 2` node" if part == "node" else "`profile -d 2` whole machine"
            for tree in results:
                rows.append(f"| {what} | {tree} | {median(tracings[tree])} "
                            f"({spread(tracings[tree])}) | {median(results[tree])} "
                            f"({spread(results[tree])}) | "
                            + (f"perf {median(perfs)} ({spread(perfs)}); ratio "
                               f"{median(ratios)} ({spread(ratios)})"
                               if tree == trees[0][0] else "") + " |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load = os.getloadavg()
    lines = [f"# Cold starts on big programs ({HZ} Hz)", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, "
             f"{os.cpu_count()} CPUs shared (load average at the end {load[0]:.1f}). "
             "`python3 bench/cold_start.py`. Cold: ustack's cache directory empty "
             "(USTACK_CACHE_DIR, a new one) AND the page cache dropped before every run "
             "(perf's runs too). Seconds, median (min-max) of "
             f"{a.reps}; the ratio is ustack's end / perf's, pair by pair.", "",
             "| run | tree | to the Tracing line (s) | to the end (s) | perf record -g + "
             "perf script (s) |", "| --- | --- | --- | --- | --- |", *rows, ""]
    text = "\n".join(lines)
    print(text)
    (REPO / "bench" / "results" / "cold_start.md").write_text(text)


if __name__ == "__main__":
    main()
