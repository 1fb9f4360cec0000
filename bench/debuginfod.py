#!/usr/bin/env python3
"""What a debuginfod server costs a short run: a stripped program
(tests/programs/served.c, -O2) counted at its `sink` with

  none     no DEBUGINFOD_URLS
  silent   DEBUGINFOD_URLS = a server that accepts and never answers
  served   DEBUGINFOD_URLS = Debian's debuginfod holding the debug file
           (the cache emptied before each run: a fetch every time)

    sudo python3 bench/debuginfod.py [--reps N]

`ustack count uprobe:STRIPPED:ADDR -c 'STRIPPED 3'` in a fresh process each
time, the kinds alternating (none, silent, served, none, …) REPS times
(default 11); wall time from fork to exit and CPU time (ustack and the
traced program: less noisy on a shared machine), medians; and for each kind how
many runs named `sink` (the served file arrived before the end of the run)
and how many said the object was not named yet. Writes
bench/results/debuginfod.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO / "tests"))
from helpers import O2_FP, build, nm_symbols, ustack_env  # noqa: E402


def silent_server() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held = []
    threading.Thread(target=lambda: [held.append(sock.accept()) for _ in iter(int, 1)],
                     daemon=True).start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}"


def debuginfod_server(tmp: Path, full: Path, build_id: str) -> tuple:
    (tmp / "debug").mkdir()
    subprocess.run(["objcopy", "--only-keep-debug", str(full),
                    str(tmp / "debug" / "served.debug")], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["debuginfod", "-p", str(port), "-F", str(tmp / "debug"),
                             "-d", str(tmp / "index.sqlite")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/buildid/{build_id}/debuginfo", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("debuginfod did not serve the debug file within 60 s")


def build_id_of(path: Path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return out.split("Build ID: ")[1].split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=11)
    reps = ap.parse_args().reps
    tmp = Path(tempfile.mkdtemp(prefix="ustack-debuginfod-"))
    full = build("served", flags=O2_FP)
    stripped = tmp / "served"
    subprocess.run(["objcopy", "--strip-all", str(full), str(stripped)], check=True)
    build_id = build_id_of(full)
    sink = hex(nm_symbols(full)["sink"][0])
    server, served_url = debuginfod_server(tmp, full, build_id)
    urls = {"none": None, "silent": silent_server(), "served": served_url}
    cache = tmp / "cache"
    cmd = [sys.executable, "-m", "ustack", "count", f"uprobe:{stripped}:{sink}",
           "-c", f"{stripped} 3"]
    times = {k: [] for k in urls}
    cpu = {k: [] for k in urls}       # CPU s of ustack and the traced program
    named = {k: 0 for k in urls}
    said = {k: 0 for k in urls}
    try:
        for rep in range(reps + 1):              # the first round warms, untimed
            for kind, url in urls.items():
                shutil.rmtree(cache, ignore_errors=True)
                env = dict(ustack_env(), USTACK_CACHE_DIR=str(cache))
                env.pop("DEBUGINFOD_URLS", None)
                if url:
                    env["DEBUGINFOD_URLS"] = url
                t0, r0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
                res = subprocess.run(cmd, env=env, capture_output=True, text=True)
                wall = time.monotonic() - t0
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu_s = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                if res.returncode != 0:
                    raise SystemExit(f"{kind}: exit {res.returncode}: {res.stderr}")
                if rep:
                    times[kind].append(wall)
                    cpu[kind].append(cpu_s)
                    named[kind] += "sink [served]" in res.stdout
                    said[kind] += "had not arrived" in res.stderr
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    base = statistics.median(times["none"])
    base_cpu = statistics.median(cpu["none"])
    rows = ["| DEBUGINFOD_URLS | median wall s | min | max | ÷ none | median CPU s "
            "| ÷ none | runs naming sink | runs saying 'not named yet' |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for kind, ts in times.items():
        m, c = statistics.median(ts), statistics.median(cpu[kind])
        rows.append(f"| {kind} | {m:.3f} | {min(ts):.3f} | {max(ts):.3f} | {m / base:.3f} "
                    f"| {c:.3f} | {c / base_cpu:.3f} "
                    f"| {named[kind]}/{reps} | {said[kind]}/{reps} |")
    load = os.getloadavg()[0]
    text = "\n".join([
        "# debuginfod: what a server costs a short run", "",
        f"`python3 bench/debuginfod.py --reps {reps}` on {time.strftime('%Y-%m-%d')}, "
        f"kernel {platform.release()}, {os.cpu_count()} CPUs, load average "
        f"{load:.1f} at the end.", "",
        f"`{' '.join(['ustack', *cmd[3:]]).replace(str(tmp), 'TMP')}`, kinds alternating, "
        "each run a fresh process with an empty cache.", "", *rows, ""])
    out = BENCH / "results" / "debuginfod.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
