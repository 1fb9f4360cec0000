#!/usr/bin/env python3
"""Python frames of Pythons that change during a run, per CPython:
tests/programs/python/live.py's threads started 0.5 s in, 4 workers
forked during the run, a Python started once a whole-machine run samples
and one already running; a ~50 ms script under count, trace, profile and
offcpu, RUNS times each; and what the in-kernel walk costs per sample
(the kernel's BPF statistics, BPF_ENABLE_STATS) on a Python and on a C
program. Each figure for this checkout's src/ and, with --old DIR, for
another tree's src/ (`git archive main src | tar -x -C DIR`), alternated.
py-spy (PyPI) records the same threads program as the oracle.

    sudo python3 bench/python_live.py [--old DIR] [--runs 20] [--versions 3.9,3.11]

Prints Markdown."""
from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIVE = REPO / "tests" / "programs" / "python" / "live.py"
EVAL = "_PyEval_EvalFrameDefault"
DEBIAN = "/usr/bin/python3.11"
LATER_S = 1.0           # a whole-machine run's Python is started this long after it samples

# one ustack run; prints "runs ns_per_run" of the program named argv[1]
from python_pass_cost import ONE_RUN  # noqa: E402 (bench/ is this script's path)


def python_of(version: str) -> str:
    if version == "debian":
        return DEBIAN
    found = sorted(glob.glob(f"/root/.pyenv/versions/{version}.*/bin/python3"))
    return found[-1] if found else sys.exit(f"no CPython {version} under pyenv")


def ustack(src: Path, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ustack", *args], cwd="/tmp",
                            env={**os.environ, "PYTHONPATH": str(src)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def python_chain(stack: dict) -> list:
    return [f["function"] for f in reversed(stack["frames"]) if f.get("kind") == "python"]


def in_python(stack: dict) -> bool:
    return bool(python_chain(stack)) or any(f["function"] == EVAL for f in stack["frames"])


def share(stacks: list, whose, func: str | None) -> tuple:
    """(samples of `whose` that ran Python with `func` (None: any) among
    their Python frames and no eval C frame left, samples of `whose` that
    ran Python, those shown as a bare eval loop: no Python frame and no
    note)."""
    good = total = bare = 0
    for s in stacks:
        if whose(s) and in_python(s):
            total += s["count"]
            names = [f["function"] for f in s["frames"]]
            chain = python_chain(s)
            if (func in chain if func else chain) and EVAL not in names:
                good += s["count"]
            elif not python_chain(s) and not s.get("notes"):
                bare += s["count"]
    return good, total, bare


def profile_command(src: Path, python: str, mode: str, cpu: str) -> tuple:
    with tempfile.TemporaryDirectory() as tmp:
        us = ustack(src, "profile", "-F", "199", "-f", "json", "-c",
                    f"{python} {LIVE} {mode} {cpu} {tmp}/ready")
        out, err = us.communicate(timeout=300)
        pid = int(Path(tmp, "ready").read_text().split()[1])
    return json.loads(out)["stacks"], pid


def threads(src, python) -> tuple:
    stacks, pid = profile_command(src, python, "threads", "0.5")
    return share(stacks, lambda s: s["pid"] == pid and any(
        f["function"] == "start_thread" for f in s["frames"]), "pool_worker")


def requests(src, python) -> tuple:
    stacks, pid = profile_command(src, python, "requests", "1")
    return share(stacks, lambda s: s["pid"] == pid and any(
        f["function"] == "start_thread" for f in s["frames"]), "request")


def requests_by_cause(src, python) -> dict:
    """A thread per request's samples that ran Python, by what they show:
    "chain" (its Python chain, no eval C frame left), "bare" (an eval
    loop, no Python frame, no note), else the note they carry."""
    stacks, pid = profile_command(src, python, "requests", "1")
    out: dict = {}
    for s in stacks:
        if s["pid"] != pid or not in_python(s) or not any(
                f["function"] == "start_thread" for f in s["frames"]):
            continue
        names = [f["function"] for f in s["frames"]]
        if python_chain(s) and EVAL not in names:
            why = "chain"
        else:
            why = "; ".join(s.get("notes") or ()) or ("bare" if not python_chain(s) else "?")
        out[why] = out.get(why, 0) + s["count"]
    return out


def forked(src, python) -> tuple:
    stacks, parent = profile_command(src, python, "fork", "0.5")
    return share(stacks, lambda s: s["pid"] != parent, "forked_worker")


def whole_machine(src, python) -> tuple:
    """((started LATER_S after the run samples: good, total), (running
    before: good, total))."""
    with tempfile.TemporaryDirectory() as tmp:
        # runs until killed: a loaded machine's ustack may take seconds to start
        before = subprocess.Popen([python, str(LIVE), "short", "600", f"{tmp}/before"])
        while not Path(tmp, "before").exists():
            time.sleep(0.01)
        us = ustack(src, "profile", "-F", "199", "-f", "json")
        us.stderr.readline()                    # "Tracing ...": sampling
        time.sleep(LATER_S)                     # the run's lazy loads under way or done
        subprocess.run([python, str(LIVE), "short", "0.5", f"{tmp}/later"], check=True)
        us.send_signal(signal.SIGINT)
        out, _err = us.communicate(timeout=120)
        before.kill()
        before.wait()
        later = int(Path(tmp, "later").read_text().split()[1])
        running = int(Path(tmp, "before").read_text().split()[1])
    stacks = json.loads(out)["stacks"]
    # any chain: a Python started during the run is sampled in its start-up
    # too (site's imports, run from C), before short_main
    return (share(stacks, lambda s: s["pid"] == later, None),
            share(stacks, lambda s: s["pid"] == running, None))


SHORT = {"count": (("count", "syscall:getppid"), "short_task"),
         "trace": (("trace", "syscall:getppid"), "short_task"),
         "profile": (("profile", "-F", "999"), "short_task"),
         "offcpu": (("offcpu",), "short_wait")}


def short_named(src, python, command: str) -> bool:
    """Whether a ~50 ms script's stacks at its leaf all carry <module> ->
    main -> short_main -> leaf, and some do, and none of its frames under
    short_main is left unnamed."""
    args, leaf = SHORT[command]
    with tempfile.TemporaryDirectory() as tmp:
        us = ustack(src, *args, "-f", "json", "-c", f"{python} {LIVE} short 0.05 {tmp}/ready")
        out, _err = us.communicate(timeout=120)
        pid = int(Path(tmp, "ready").read_text().split()[1])
    try:
        stacks = ([json.loads(line) for line in out.splitlines()] if command == "trace"
                  else json.loads(out)["stacks"])
    except ValueError:          # kept for a look: the run counts as not named
        kept = Path(tempfile.mkstemp(prefix=f"short-{command}-", suffix=".out")[1])
        kept.write_text(out)
        print(f"(not JSON: {kept})", file=sys.stderr, flush=True)
        return False
    chains = [python_chain(s) for s in stacks if s["pid"] == pid]
    at_leaf = [c for c in chains if leaf in c]
    # the script's own frames (a module body an import ran and freed at
    # start-up may be gone before it is read: not the script's)
    unnamed = [c for c in chains if "short_main" in c
               and any(n.startswith("[python code") for n in c)]
    return bool(at_leaf) and not unnamed and all(
        c[:4] == ["<module>", "main", "short_main", leaf] for c in at_leaf)


def py_spy_threads(python: str) -> tuple:
    """py-spy record on the threads program: (samples with pool_worker,
    samples of the pool's threads)."""
    spy = Path(sys.executable).parent / "py-spy"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(spy), "record", "-r", "199", "-f", "raw", "-t", "-o", f"{tmp}/out",
                        "--", python, str(LIVE), "threads", "0.5", f"{tmp}/ready"],
                       capture_output=True, timeout=300)
        good = total = 0
        for line in Path(tmp, "out").read_text().splitlines():
            stack, n = line.rsplit(" ", 1)
            if "_bootstrap" in stack:
                total += int(n)
                good += int(n) if "pool_worker" in stack else 0
    return good, total, 0


def cost(src: Path, python: str | None) -> float:
    """ns per run of the profile program sampling a busy target at 999 Hz:
    live.py's threads on `python`, else a shell loop (no Python)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = f"{python} {LIVE} threads 1 {tmp}/ready" if python else \
            "sh -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'"
        out = subprocess.run([sys.executable, "-c", ONE_RUN, "ustack_uw0", "profile", "-F",
                              "999", "-c", cmd], capture_output=True, text=True, timeout=300,
                             cwd="/tmp", env={**os.environ, "PYTHONPATH": str(src)})
    return float(out.stdout.split()[1])


def pct(counted: tuple) -> str:
    good, total, bare = counted
    return f"{good}/{total} ({100 * good / max(total, 1):.0f} %), {bare} bare"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="a tree whose src/ is the code to compare with")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--versions", default="3.9,3.10,3.11,3.12,3.13,debian")
    ap.add_argument("--cost-reps", type=int, default=5)
    ap.add_argument("--short-python", default="3.12",
                    help="the short script's CPythons, comma-separated (as --versions)")
    ap.add_argument("--skip", default="", help="comma-separated: shares,short,cost,pyspy")
    ap.add_argument("--request-runs", type=int, default=0,
                    help="runs of the thread-per-request program per version, "
                         "its samples counted by what they show")
    a = ap.parse_args()
    trees = [("this tree", REPO / "src")]
    if a.old:
        trees.append(("old", Path(a.old) / "src"))
    skip = set(a.skip.split(","))
    versions = a.versions.split(",")
    if "shares" not in skip:
        print("Samples of each with its Python chain (profile -F 199), and those "
              "shown as a bare eval loop (no Python frame, no note):\n")
        print("| CPython | code | threads started 0.5 s in | a thread per request "
              "| 4 forked workers | whole machine, started 1 s in "
              "| whole machine, running before |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for v in versions:
            python = python_of(v)
            for name, src in trees:
                later, before = whole_machine(src, python)
                print(f"| {v} | {name} | {pct(threads(src, python))} "
                      f"| {pct(requests(src, python))} | {pct(forked(src, python))} "
                      f"| {pct(later)} | {pct(before)} |", flush=True)
    if a.request_runs:
        print(f"\nA thread per request, {a.request_runs} runs per version: the request "
              "threads' samples that ran Python, by what they show (chain: the Python "
              "chain, no eval C frame left; bare: an eval loop with no Python frame and "
              "no note; else the note):\n")
        for v in versions:
            for name, src in trees:
                runs = [requests_by_cause(src, python_of(v)) for _ in range(a.request_runs)]
                print(f"- {v}, {name}: " + "; ".join(
                    ", ".join(f"{why}: {n}" for why, n in sorted(r.items())) or "none"
                    for r in runs), flush=True)
    if "pyspy" not in skip:
        print("\npy-spy record -r 199 on the threads program, samples of the pool's "
              "threads with pool_worker:\n")
        for v in versions:
            print(f"- {v}: {pct(py_spy_threads(python_of(v)))}", flush=True)
    if "short" not in skip:
        print(f"\nA ~50 ms script: runs whose frames are all named, of {a.runs}:\n")
        print("| CPython | code | " + " | ".join(SHORT) + " |")
        print("|---|---|" + "---:|" * len(SHORT))
        for v in a.short_python.split(","):
            for name, src in trees:
                cells = [sum(short_named(src, python_of(v), c) for _ in range(a.runs))
                         for c in SHORT]
                print(f"| {v} | {name} | " + " | ".join(f"{n}/{a.runs}" for n in cells) + " |",
                      flush=True)
    if "cost" not in skip:
        print(f"\nThe profile program's ns per run at 999 Hz, median of {a.cost_reps}, "
              "alternated:\n")
        print("| target | " + " | ".join(name for name, _ in trees) + " |")
        print("|---|" + "---:|" * len(trees))
        for target in ("3.12", None):
            runs = {name: [] for name, _ in trees}
            for _ in range(a.cost_reps):
                for name, src in trees:
                    runs[name].append(cost(src, python_of(target) if target else None))
            label = f"CPython {target} threads" if target else "a shell loop"
            print(f"| {label} | " + " | ".join(
                f"{statistics.median(runs[name]):.0f}" for name, _ in trees) + " |", flush=True)


if __name__ == "__main__":
    main()
