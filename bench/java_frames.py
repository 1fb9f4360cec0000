#!/usr/bin/env python3
"""java with default flags and no perf map: how many of its samples ustack
walks to the thread's start with Java methods named, and how its top Java
methods compare with Java Flight Recorder's execution samples on the same
run of bench/programs/JavaMix.java (whose second half runs methods first
called then: compiled while the run samples); then what the walk costs
per sample.

    sudo python3 bench/java_frames.py [--seconds S] [--reps R] [--jdk HOME]

--jdk: the JDK whose java, javac, jcmd and jfr run (its bin/ put first on
the PATH), e.g. /usr/lib/jvm/temurin-25-jdk-amd64; the PATH's by default.

Scopes: -p (a JVM started just before, JFR started in it by `jcmd PID
JFR.start`), -c (JFR started by the command's -XX:StartFlightRecording:
the oracle's flag, not ustack's), whole machine (no target, -d: a JVM
started before the run, JFR by jcmd; and one started 1 s into the run,
JFR by its flag), the JVM's own stacks judged. Only the thread that runs main is
compared (JFR's `sampledThread = "main"`; ustack's stacks through
JavaMain). A sample is a Java sample when it holds a Java method's frame;
it is whole when it ends at the thread's root (clone3) with every Java
frame named. A method's share is the samples whose innermost Java method
it is, over the Java samples (JFR: its top frame); the JVM's stubs are
not methods, and the samples whose innermost frame is one (the math
intrinsics, dsin or dlog, sit in StubRoutines' blobs) are left out of
the shares: JFR's sampler cannot walk from there and records none.

The shares are compared over the window both sampled (from the later of
their first samples of main to the earlier of their last; each ustack
sample carries its time, JFR's events their startTime): a -p run's JFR
starts before ustack is live, and JavaMix's two halves run different
methods. Beside the comparison, the oracle's own noise: JFR's window
dealt alternately into two halves and compared the same way; JFR of one
run against the next's; and what sampling alone gives at these counts
(the top-10 max difference of 2000 pairs drawn from the pooled shares,
median and 95th percentile; the largest binomial standard error of one
method's difference). Then, per scope, how many runs are within 5
points and each method's mean difference and sign across runs.

    sudo python3 bench/java_frames.py --seconds 16 --reps 6 --no-cost \
        --scopes='-p;-c;whole machine;whole machine, started during'

JFR leaves DebugNonSafepoints off (`jcmd PID VM.flags -all` while it
records, JDK 17 and 25): it and the walk read the same PcDescs, which C2
records only at calls and safepoint polls. A run without JFR (`-p, no
JFR`) shows what the walk gives with no recording running.

Prints Markdown."""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
MIX = REPO / "bench" / "programs" / "JavaMix.java"
ROOT = "clone3"


def ustack_counts(**scope) -> list:
    import ustack
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf", **scope)
    run = ustack.Session(opts)
    with run:
        return run.counts()


# CLOCK_MONOTONIC (the samples' clock) to the wall clock JFR stamps its events with
WALL_MINUS_MONOTONIC = time.time_ns() - time.monotonic_ns()


def ustack_samples(watch=None, **scope) -> tuple:
    """(samples, untimed): each sample of the run as (wall-clock ns, pid,
    frames), in time order, so that it can be cut to the window JFR sampled
    too; and how many stacks the kernel counted with no time (walked there:
    none of a JVM's Java frames are). `watch(run)`, if given, runs beside
    the run and ends it (a whole-machine run)."""
    import threading
    import ustack
    from ustack.counting.tally import kernel_counted
    run = ustack.Session(ustack.Options(command="profile", events=["profile:hz:199"],
                                        backend="bpf", **scope))
    with run:
        if watch is not None:
            threading.Thread(target=watch, args=(run,), daemon=True).start()
        samples = [(e.sample.time_ns + WALL_MINUS_MONOTONIC, e.sample.pid, e.stack.frames)
                   for e in run.events()]
        untimed = [(s.pid, run.resolver.stack(s).frames, n) for s, n in kernel_counted(run)]
    return samples, untimed


def machine_samples(proc: subprocess.Popen | None, start) -> tuple:
    """ustack_samples of the JVM's process in a whole-machine run that
    ends as it exits: the JVM `proc` running before the run, or, given
    None, the one `start()` starts 1 s into the run."""
    jvm = {"proc": proc}

    def watch(run):
        if jvm["proc"] is None:
            time.sleep(1)
            jvm["proc"] = start()
        jvm["proc"].wait()
        run.stop()
    samples, untimed = ustack_samples(watch)
    pid = jvm["proc"].pid
    return [s for s in samples if s[1] == pid], [u for u in untimed if u[0] == pid]


def ustack_shares(stacks) -> tuple:
    """(Java samples, whole ones, in stubs, Counter of innermost Java method
    -> samples) of main's thread, from (frames, count) pairs."""
    java = whole = stub = 0
    top: collections.Counter = collections.Counter()
    for frames, count in stacks:
        if not any(f.function == "JavaMain" for f in frames):
            continue
        methods = [f for f in frames if f.kind == "java" and not f.function.startswith("[")]
        if not methods:
            continue
        java += count
        named = not any((f.function or "").startswith("[java ") for f in frames)
        whole += count * (named and frames[-1].function == ROOT)
        if frames[0].kind == "java" and frames[0].function.startswith("["):
            stub += count     # in the JVM's stubs: JFR records no sample there
            continue
        top[methods[0].function] += count
    return java, whole, stub, top


def main_java_times(samples: list) -> list:
    """The times of main's samples holding a Java method (what the shares count)."""
    return [t for t, _pid, frames in samples
            if any(f.function == "JavaMain" for f in frames)
            and any(f.kind == "java" and not f.function.startswith("[") for f in frames)]


def jfr_samples(recording: str) -> list:
    """(wall-clock ns, top frame's method) of each of JFR's execution
    samples of main, in time order."""
    import datetime
    import json
    text = subprocess.run(["jfr", "print", "--json", "--stack-depth", "1", "--events",
                           "jdk.ExecutionSample", recording],
                          capture_output=True, text=True, check=True).stdout
    out = []
    for event in json.loads(text)["recording"]["events"]:
        v = event["values"]
        if (v["sampledThread"] or {}).get("javaName") != "main" or not v["stackTrace"]:
            continue
        method = v["stackTrace"]["frames"][0]["method"]
        stamp = v["startTime"]              # 2026-11-29T18:44:34.867170491Z
        whole_s, _, frac = stamp.rstrip("Z").partition(".")
        seconds = datetime.datetime.fromisoformat(whole_s).replace(
            tzinfo=datetime.timezone.utc).timestamp()
        ns = int(seconds) * 10**9 + int((frac + "000000000")[:9])
        out.append((ns, f"{method['type']['name'].replace('/', '.')}.{method['name']}"))
    out.sort()
    return out


def compare(ours: collections.Counter, theirs: collections.Counter) -> list:
    """Rows (method, ours %, theirs %, difference) of JFR's top 10."""
    n_ours, n_theirs = sum(ours.values()) or 1, sum(theirs.values()) or 1
    rows = []
    for key, n in theirs.most_common(10):
        a, b = 100 * ours.get(key, 0) / n_ours, 100 * n / n_theirs
        rows.append((key, a, b, a - b))
    return rows


def worst(rows: list) -> float:
    return max(abs(r[3]) for r in rows) if rows else float("nan")


def sampling_noise(ours: collections.Counter, theirs: collections.Counter,
                   draws: int = 2000) -> tuple:
    """What top-10 max difference sampling alone gives at these counts:
    (median, 95th percentile) over `draws` pairs of samples drawn from the
    two samplers' pooled shares, as many as each took; and the largest
    binomial standard error (points) of one method's difference."""
    import math
    import random
    pooled = ours + theirs
    names, weights = list(pooled), list(pooled.values())
    n_ours, n_theirs = sum(ours.values()), sum(theirs.values())
    if not n_ours or not n_theirs:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(36)
    gaps = sorted(worst(compare(collections.Counter(rng.choices(names, weights, k=n_ours)),
                                collections.Counter(rng.choices(names, weights, k=n_theirs))))
                  for _ in range(draws))
    total = sum(weights)
    se = max(100 * math.sqrt(n / total * (1 - n / total) * (1 / n_ours + 1 / n_theirs))
             for n in weights)
    return gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.95)], se


def _started(proc: subprocess.Popen) -> None:
    if proc.stdout.readline() != "started\n":
        raise SystemExit("JavaMix did not start")


def scope_run(scope: str, classes: str, seconds: float, tmp: str) -> dict:
    """One run of JavaMix in `scope`, ustack's samples and JFR's judged
    (see judged)."""
    recording = os.path.join(tmp, f"{scope.replace(' ', '_').replace(',', '')}.jfr")
    if os.path.exists(recording):
        os.unlink(recording)            # the last rep's
    if scope == "-c":
        cmd = (f"java -XX:StartFlightRecording=filename={recording},settings=profile "
               f"-cp {classes} JavaMix {seconds}")
        samples, untimed = ustack_samples(cmdline=cmd)
    elif scope == "whole machine, started during":
        samples, untimed = machine_samples(None, lambda: subprocess.Popen(
            ["java", f"-XX:StartFlightRecording=filename={recording},settings=profile",
             "-cp", classes, "JavaMix", str(seconds)], stdout=subprocess.DEVNULL))
    elif scope == "whole machine":
        proc = subprocess.Popen(["java", "-cp", classes, "JavaMix", str(seconds)],
                                stdout=subprocess.PIPE, text=True)
        _started(proc)
        subprocess.run(["jcmd", str(proc.pid), "JFR.start", "name=bench", "settings=profile",
                        f"filename={recording}"], check=True, capture_output=True)
        samples, untimed = machine_samples(proc, None)
    else:
        proc = subprocess.Popen(["java", "-cp", classes, "JavaMix", str(seconds)],
                                stdout=subprocess.PIPE, text=True)
        _started(proc)
        if scope == "-p":
            subprocess.run(["jcmd", str(proc.pid), "JFR.start", "name=bench", "settings=profile",
                            f"filename={recording}"], check=True, capture_output=True)
        samples, untimed = ustack_samples(pid=proc.pid)       # until it exits
        proc.wait()
    theirs = jfr_samples(recording) if os.path.exists(recording) else None
    return judged(samples, untimed, theirs)


def judged(samples: list, untimed: list, theirs: list | None) -> dict:
    """ustack's samples against JFR's over the window both sampled: from
    the later of the two first samples of main (in Java) to the earlier of
    the two last. JavaMix has phases (its second half runs methods first
    called then) and the two samplers start at different moments (a -p
    run's JFR before ustack is live, a -c run's with the JVM), so samples
    outside the common window would weigh one phase more for one sampler.
    Beside it: the whole runs' comparison (the old, unwindowed one), JFR
    against itself (its window's samples dealt alternately into two
    halves) and what sampling noise alone gives at these counts."""
    stacks = [(frames, 1) for _t, _pid, frames in samples]
    java_untimed = ustack_shares((frames, n) for _pid, frames, n in untimed)[0]
    java, whole, stub, ours_all = ustack_shares(stacks + [(f, n) for _p, f, n in untimed])
    out = {"java": java, "whole": whole, "stub": stub, "untimed": java_untimed,
           "ours": ours_all, "rows": [], "n_ours": 0, "n_theirs": 0}
    if theirs is None:
        return out
    times = main_java_times(samples)
    lo, hi = max(times[0], theirs[0][0]), min(times[-1], theirs[-1][0])
    _j, _w, _s, ours = ustack_shares((f, 1) for t, _pid, f in samples if lo <= t <= hi)
    inside = [m for t, m in theirs if lo <= t <= hi]
    jfr = collections.Counter(inside)
    out.update(ours=ours, theirs=jfr, rows=compare(ours, jfr),
               n_ours=sum(ours.values()), n_theirs=len(inside),
               window=(hi - lo) / 1e9, cut=(len(theirs) - len(inside),
                                              len(times) - sum(lo <= t <= hi for t in times)),
               unwindowed=worst(compare(ours_all, collections.Counter(m for _t, m in theirs))),
               halves=worst(compare(collections.Counter(inside[0::2]),
                                    collections.Counter(inside[1::2]))),
               noise=sampling_noise(ours, jfr))
    return out


def walk_cost(classes: str, seconds: float) -> tuple:
    """(µs per Java walk: median and samples, µs per DWARF walk of the same
    kind of copy with --no-java) of a -c run of JavaMix, timed in this
    process around the unwinder's calls."""
    from ustack.model import SymbolOptions
    from ustack.unwind import dwarf, hotspot_live
    out = {}
    for label, java in (("java", True), ("no-java", False)):
        times: list = []
        frames: list = []
        target = (hotspot_live.HotSpotLive, "unwind") if java else (dwarf.DwarfUnwinder, "unwind")
        original = getattr(*target)

        def timed(*a, _original=original, **kw):
            t = time.perf_counter_ns()
            got = _original(*a, **kw)
            times.append(time.perf_counter_ns() - t)
            frames.append(len(got[0]) if got else 0)
            return got
        setattr(*target, timed)
        try:
            ustack_counts(cmdline=f"java -cp {classes} JavaMix {seconds}",
                          symbols=SymbolOptions(java=java))
        finally:
            setattr(*target, original)
        out[label] = (statistics.median(times) / 1000 if times else float("nan"), len(times),
                      statistics.median(frames) if frames else 0)
    return out


def kernel_cost(classes: str, reps: int) -> list:
    """Rows (process, ns per run of the in-kernel walking program: medians
    of `reps` runs): a JVM (its stacks through the JIT go to user space
    with their copy) beside JIT code of a process running no JVM and a
    process without JIT code (both walked in the kernel)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from python_pass_cost import one_cost
    jit = os.path.join(classes, "jit")
    subprocess.run(["gcc", "-O2", "-g", "-fomit-frame-pointer", "-o", jit,
                    str(REPO / "tests" / "programs" / "jit.c")], check=True)
    # ~2 s of CPU through its JIT code; the perf map it writes removed after
    through_jit = (f"sh -c '\"$0\" 200000000 & p=$!; wait $p; rm -f /tmp/perf-$p.map' {jit}")
    rows = []
    for label, command in (("java JavaMix (deferred: stack copied)",
                            f"java -cp {classes} JavaMix 2"),
                           ("tests/programs/jit.c, its JIT code, no JVM (walked in the kernel)",
                            through_jit),
                           ("sh busy loop (no JIT)", "timeout 2 sh -c 'while :; do :; done'")):
        rows.append((label, statistics.median(one_cost(None, command) for _ in range(reps))))
    return rows


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="ustack-java-")
    try:
        run(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)      # the classes and JFR's recordings


def run(tmp: str) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--cost-only", action="store_true", help="the cost table alone")
    ap.add_argument("--no-cost", action="store_true", help="the comparison alone")
    ap.add_argument("--scopes", default="-p;-c;-p, no JFR;whole machine;"
                    "whole machine, started during", help="which, ';' between them")
    ap.add_argument("--jdk", help="the JDK's home (its bin/ first on the PATH)")
    args = ap.parse_args()
    if args.jdk:
        os.environ["PATH"] = f"{Path(args.jdk) / 'bin'}:{os.environ.get('PATH', '')}"
    subprocess.run(["javac", "-d", tmp, str(MIX)], check=True)
    version = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    print(f"{version.splitlines()[0]}, bench/programs/JavaMix.java for {args.seconds:g} s "
          f"of CPU, profile:hz:199, backend bpf, load average {os.getloadavg()[0]:.1f}\n")
    print("| scope | Java samples (main) | whole (named, to clone3) | in stubs | "
          "window: s, ustack / JFR samples | top-10 max difference (points) | "
          "whole runs, unwindowed | JFR vs JFR (halves) | sampling noise: median / 95 % | "
          "largest SE |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    tables, by_scope = [], collections.defaultdict(list)
    for _rep in range(0 if args.cost_only else args.reps):
        for scope in args.scopes.split(";"):
            r = scope_run(scope, tmp, args.seconds, tmp)
            by_scope[scope].append(r)
            java = max(r["java"], 1)
            head = (f"| {scope} | {r['java']} | {100 * r['whole'] / java:.1f} % | "
                    f"{100 * r['stub'] / java:.1f} % | ")
            if r["rows"]:
                median, high, se = r["noise"]
                print(head + f"{r['window']:.1f}, {r['n_ours']} / {r['n_theirs']} | "
                      f"{worst(r['rows']):.1f} | {r['unwindowed']:.1f} | {r['halves']:.1f} | "
                      f"{median:.1f} / {high:.1f} | {se:.1f} |", flush=True)
            else:
                print(head + "- | - | - | - | - | - |", flush=True)
            if r["untimed"]:
                print(f"|  (of which {r['untimed']} counted in the kernel, untimed: "
                      "in the whole-run figures only) |||||||||", flush=True)
            shared = sum(r["ours"].values()) or 1
            tables.append((scope, r["rows"] or [(k, 100 * n / shared, float("nan"), float("nan"))
                                                for k, n in r["ours"].most_common(10)]))
    for scope, runs in by_scope.items():
        judged_runs = [r for r in runs if r["rows"]]
        if not judged_runs:
            continue
        within = sum(worst(r["rows"]) <= 5 for r in judged_runs)
        across = [worst(compare(a["theirs"], b["theirs"]))
                  for a, b in zip(judged_runs, judged_runs[1:])]
        print(f"\n{scope}: {within} of {len(judged_runs)} runs within 5 points; JFR of one "
              f"run against the next's: {' / '.join(f'{g:.1f}' for g in across) or '-'}")
        signs = collections.defaultdict(list)
        for r in judged_runs:
            for name, _a, _b, d in r["rows"]:
                signs[name].append(d)
        print("\n| method (in JFR's top 10) | runs | mean difference | over / under |")
        print("|---|---:|---:|---:|")
        for name, ds in sorted(signs.items(), key=lambda kv: -abs(statistics.mean(kv[1]))):
            print(f"| {name} | {len(ds)} | {statistics.mean(ds):+.1f} | "
                  f"{sum(d > 0 for d in ds)} / {sum(d < 0 for d in ds)} |")
    for scope, rows in tables:
        judged_by_jfr = bool(rows) and rows[0][2] == rows[0][2]
        print(f"\n{scope}: {'JFR' if judged_by_jfr else 'ustack'}'s top 10, share of main's "
              f"Java samples{' in the common window' if judged_by_jfr else ''}\n")
        print("| method | ustack % | JFR % | difference |")
        print("|---|---:|---:|---:|")
        for name, a, b, d in rows:
            print(f"| {name} | {a:.1f} | {b:.1f} | {d:+.1f} |" if b == b
                  else f"| {name} | {a:.1f} | - | - |")
    if args.no_cost:
        return
    cost = walk_cost(tmp, args.seconds)
    print("\nuser-space walk per copied sample of the JVM (µs, median; -c run each)\n")
    print("| walk | µs per sample | frames per sample | samples |")
    print("|---|---:|---:|---:|")
    for label, (us, n, depth) in cost.items():
        what = ("Java frames (hotspot_live) + native CFI" if label == "java"
                else "DWARF/frame pointer only (--no-java)")
        print(f"| {what} | {us:.0f} | {depth:g} | {n} |")
    print(f"\nthe in-kernel walking program's ns per sample (BPF statistics, median of "
          f"{max(args.reps, 3)})\n")
    print("| process | ns per sample |")
    print("|---|---:|")
    for label, ns in kernel_cost(tmp, max(args.reps, 3)):
        print(f"| {label} | {ns:.0f} |")


if __name__ == "__main__":
    main()
