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
Runs alternate (this tree, the other tree if --before DIR, perf; the
first tree first every other repetition); ratios are taken pair by pair,
then the median. CPU seconds (user + system) are counted too, ustack's
builders included: this process reaps what a run leaves running (its
builders finishing their object) before the next run starts, so they
count as ustack's and take no CPU from perf's run. Where the time goes,
stage by stage: bench/cold_stages.py.

    sudo python3 bench/cold_start.py [--reps N] [--before DIR/src]

Prints Markdown and writes bench/results/cold_start.md."""
from __future__ import annotations

import argparse
import ctypes
import os
import resource
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
        """A clang++ compile, once it maps libclang-cpp."""
        p = subprocess.Popen([CLANG, "-O2", "-std=c++17", "-c", str(self.work / "heavy.cpp"),
                              "-o", "/dev/null"])
        self.procs.append(p)
        wait_for(lambda: maps_has(p.pid, "libclang-cpp"))
        return p.pid

    def clang_running(self) -> None:
        """A clang++ compile running, another started if the last one ended
        (~3 s of CPU): every whole-machine run, ustack's and perf's alike,
        starts with one. Once, the first run of a pair met it and the
        second (and perf's) did not: 6.5-15 s against 3.6-4.9 s, whichever
        tree ran first."""
        if not any(p.args[0] == CLANG and p.poll() is None for p in self.procs):
            self.clang()

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
        # what is left here now: ustack's builders, reaped; chromium's
        # crashpad handlers (a process group of their own), reparented here: ended
        for pid in children():
            if not ustacks(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            reap(pid)


def subreaper() -> None:
    """Make this process the one that reaps what ustack leaves running
    (builders finishing their object after it exits), so their CPU time
    counts as ustack's, and no run's leftovers burn CPU in the next run
    (perf's above all)."""
    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def children() -> list:
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            pids += map(int, Path(f"/proc/self/task/{task}/children").read_text().split())
        except OSError:
            pass
    return pids


def reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def cpu_seconds() -> float:
    """User + system CPU seconds of the reaped children so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def ustacks(pid: int) -> bool:
    """Whether child `pid` is ustack's (a builder, the closer; the name
    stays when it has exited), not a target's."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return False
    return comm.startswith(("python", "ustack"))


def reap_leftovers(targets: "Targets") -> None:
    """Wait for what a run left running (its builders), not the targets
    nor what they started."""
    keep = {p.pid for p in targets.procs}
    for pid in children():
        if pid not in keep and ustacks(pid):
            reap(pid)


def ustack_run(src: str, cache: Path, args: list, out: Path, targets: "Targets") -> tuple:
    """(seconds to the Tracing line, seconds to the end, CPU seconds: its
    own and its builders', which it leaves to finish, and of its main
    process alone) of one run."""
    env = dict(os.environ, PYTHONPATH=src, USTACK_CACHE_DIR=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cpu = cpu_seconds()
    start = time.monotonic()
    us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", HZ, "-d", "2",
                           "-o", str(out), *args], env=env, stderr=subprocess.PIPE, text=True)
    line = us.stderr.readline()
    tracing = time.monotonic() - start
    rest = us.stderr.read()
    _pid, status, usage = os.wait4(us.pid, 0)      # its own CPU, apart from its builders'
    took = time.monotonic() - start
    if not line.startswith("Tracing") or os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"ustack failed: {line}{rest}")
    reap_leftovers(targets)
    return tracing, took, cpu_seconds() - cpu, usage.ru_utime + usage.ru_stime


def perf_run(work: Path, args: list) -> tuple:
    """(seconds, CPU seconds) of `perf record -g ... -- sleep 2` then `perf script`."""
    data = work / "perf.data"
    cpu = cpu_seconds()
    start = time.monotonic()
    for attempt in range(3):        # perf 6.1's record sometimes aborts here (build-id.c)
        done = subprocess.run(["perf", "record", "-q", "-g", "-F", HZ, "-o", str(data),
                               *args, "--", "sleep", "2"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
        if done.returncode == 0:
            break
        cpu = cpu_seconds()
        start = time.monotonic()
    done.check_returncode()
    subprocess.run(["perf", "script", "-i", str(data)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start, cpu_seconds() - cpu


def in_turn(trees: list, rep: int) -> list:
    """The trees in turn, the first one first every other repetition: the
    run right after the targets start meets them busier (clang++ ends)."""
    return trees if rep % 2 == 0 else trees[::-1]


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
    subreaper()
    trees = [("this tree", str(REPO / "src"))] + ([("before", a.before)] if a.before else [])
    work = Path(tempfile.mkdtemp(prefix="cold_start"))
    caches = work / "caches"
    caches.mkdir()
    rows = []
    loads = []                          # the 1-minute load average at each ustack run
    try:
        if "p" not in a.skip:
            for name in ("clang", "node", "chromium"):
                results = {t: ([], [], []) for t, _ in trees}
                for rep in range(a.reps):
                    for tree, src in in_turn(trees, rep):
                        targets = Targets(work)
                        try:
                            pid = getattr(targets, name)()
                            loads.append(os.getloadavg()[0])
                            tracing, took, cpu, _main = ustack_run(src, cold(caches),
                                                                   ["-p", str(pid)],
                                                                   work / "out.folded", targets)
                        finally:
                            targets.close()
                        results[tree][0].append(tracing)
                        results[tree][1].append(took)
                        results[tree][2].append(cpu)
                        print(name, tree, f"{tracing:.2f} {took:.2f} cpu {cpu:.2f}",
                              file=sys.stderr)
                for tree, (tr, took, cpu) in results.items():
                    rows.append(f"| `profile -p` {name} | {tree} | {median(tr)} ({spread(tr)}) "
                                f"| {median(took)} ({spread(took)}) | {median(cpu)} | |")
        for part, args, perf_args, needs in (
                ("node", lambda pid: ["-p", str(pid)], lambda pid: ["-p", str(pid)], ("node",)),
                ("machine", lambda pid: [], lambda pid: ["-a"], ("clang", "node", "chromium"))):
            if part in a.skip:
                continue
            results = {t: [] for t, _ in trees}
            tracings = {t: [] for t, _ in trees}
            cpus = {t: [] for t, _ in trees}
            mains = {t: [] for t, _ in trees}
            perfs, ratios, perf_cpus, cpu_ratios = [], [], [], []
            for rep in range(a.reps):
                targets = Targets(work)
                try:
                    pids = [getattr(targets, n)() for n in needs]
                    for tree, src in in_turn(trees, rep):
                        if "clang" in needs:
                            targets.clang_running()
                        loads.append(os.getloadavg()[0])
                        tracing, took, cpu, main_cpu = ustack_run(
                            src, cold(caches), args(pids[-1]), work / "out.folded", targets)
                        results[tree].append(took)
                        mains[tree].append(main_cpu)
                        tracings[tree].append(tracing)
                        cpus[tree].append(cpu)
                        cold(caches)
                        if "clang" in needs:
                            targets.clang_running()
                        p, p_cpu = perf_run(work, perf_args(pids[-1]))
                        if tree == trees[0][0]:
                            perfs.append(p)
                            ratios.append(took / p)
                            perf_cpus.append(p_cpu)
                            cpu_ratios.append(cpu / p_cpu)
                        print(part, tree, f"{tracing:.2f} {took:.2f} cpu {cpu:.2f} "
                              f"main {main_cpu:.2f} load {loads[-1]:.1f} "
                              f"perf {p:.2f} cpu {p_cpu:.2f}", file=sys.stderr)
                finally:
                    targets.close()
            what = "`profile -p -d 2` node" if part == "node" else "`profile -d 2` whole machine"
            for tree in results:
                rows.append(f"| {what} | {tree} | {median(tracings[tree])} "
                            f"({spread(tracings[tree])}) | {median(results[tree])} "
                            f"({spread(results[tree])}) | {median(cpus[tree])} "
                            f"(main process {median(mains[tree])}) | "
                            + (f"perf {median(perfs)} ({spread(perfs)}), CPU "
                               f"{median(perf_cpus)}; ratio {median(ratios)} "
                               f"({spread(ratios)}), CPU ratio {median(cpu_ratios)}"
                               if tree == trees[0][0] else "") + " |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [f"# Cold starts on big programs ({HZ} Hz)", "",
             f"{time.strftime('%Y-%m-%d')}, kernel {os.uname().release}, "
             f"{os.cpu_count()} CPUs shared (1-minute load average at ustack's runs: "
             f"median {median(loads)}, {spread(loads)}). "
             "`python3 bench/cold_start.py`. Cold: ustack's cache directory empty "
             "(USTACK_CACHE_DIR, a new one) AND the page cache dropped before every run "
             "(perf's runs too). Seconds, median (min-max) of "
             f"{a.reps}; the ratio is ustack's end / perf's, pair by pair. CPU: "
             "seconds of CPU (user + system) of the run, ustack's builders included "
             "(waited for before the next run), the median.", "",
             "| run | tree | to the Tracing line (s) | to the end (s) | CPU (s) | "
             "perf record -g + perf script (s) |", "| --- | --- | --- | --- | --- | --- |",
             *rows, ""]
    text = "\n".join(lines)
    print(text)
    (REPO / "bench" / "results" / "cold_start.md").write_text(text)


if __name__ == "__main__":
    main()
