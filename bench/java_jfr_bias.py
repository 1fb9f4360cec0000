#!/usr/bin/env python3
"""Whose bias is the gap between ustack's and JFR's Java shares on a JDK
with JFR's CPU-time sampler (JDK 25+, experimental): one -c run of
bench/programs/JavaMix.java recorded by JFR's execution samples (profile
settings) and its `jdk.CPUTimeSample` together, beside ustack's samples,
over the window all three sampled (see java_frames.judged). A CPU-time
sample is flagged `biased` when its stack could only be taken at a
safepoint; its unbiased ones are shown apart.

    sudo python3 bench/java_jfr_bias.py [--seconds S] [--jdk HOME]

Prints Markdown."""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import java_frames as jf  # noqa: E402  (bench/ on the path first)


def _wall_ns(stamp: str) -> int:
    whole_s, _, frac = stamp.rstrip("Z").partition(".")
    seconds = datetime.datetime.fromisoformat(whole_s).replace(
        tzinfo=datetime.timezone.utc).timestamp()
    return int(seconds) * 10**9 + int((frac + "000000000")[:9])


def jfr_events(recording: str, kind: str, thread_field: str) -> list:
    """(wall-clock ns, top frame's method, biased flag or None) of main's
    events of `kind`, in time order."""
    text = subprocess.run(["jfr", "print", "--json", "--stack-depth", "1", "--events", kind,
                           recording], capture_output=True, text=True, check=True).stdout
    out = []
    for event in json.loads(text)["recording"]["events"]:
        v = event["values"]
        frames = (v.get("stackTrace") or {}).get("frames")
        if (v.get(thread_field) or {}).get("javaName") != "main" or not frames:
            continue
        method = frames[0]["method"]
        out.append((_wall_ns(v["startTime"]),
                    f"{method['type']['name'].replace('/', '.')}.{method['name']}",
                    v.get("biased")))
    out.sort()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=16.0)
    ap.add_argument("--jdk", default="/usr/lib/jvm/temurin-25-jdk-amd64")
    args = ap.parse_args()
    os.environ["PATH"] = f"{Path(args.jdk) / 'bin'}:{os.environ.get('PATH', '')}"
    tmp = tempfile.mkdtemp(prefix="ustack-java-")
    try:
        subprocess.run(["javac", "-d", tmp, str(jf.MIX)], check=True)
        recording = os.path.join(tmp, "run.jfr")
        samples, _untimed = jf.ustack_samples(cmdline=(
            f"java -XX:StartFlightRecording=filename={recording},settings=profile,"
            "+jdk.CPUTimeSample#enabled=true,+jdk.CPUTimeSample#throttle=10ms "
            f"-cp {tmp} JavaMix {args.seconds}"))
        execution = jfr_events(recording, "jdk.ExecutionSample", "sampledThread")
        cpu = jfr_events(recording, "jdk.CPUTimeSample", "eventThread")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    times = jf.main_java_times(samples)
    lo = max(times[0], execution[0][0], cpu[0][0])
    hi = min(times[-1], execution[-1][0], cpu[-1][0])
    ours = jf.ustack_shares((f, 1) for t, _pid, f in samples if lo <= t <= hi)[3]
    sets = {"ExecutionSample": [m for t, m, _b in execution if lo <= t <= hi],
            "CPUTimeSample": [m for t, m, _b in cpu if lo <= t <= hi],
            "CPUTimeSample, not biased": [m for t, m, b in cpu if lo <= t <= hi and not b]}
    shares = {k: collections.Counter(v) for k, v in sets.items()}
    print(f"window {(hi - lo) / 1e9:.1f} s: ustack {sum(ours.values())} samples of main, "
          + ", ".join(f"{k} {len(v)}" for k, v in sets.items()) + "\n")
    names = [k for k, _ in shares["ExecutionSample"].most_common(10)]
    names += [k for k, _ in shares["CPUTimeSample"].most_common(10) if k not in names]
    print("| method | ustack % | " + " | ".join(f"{k} %" for k in sets) + " |")
    print("|---|---:|" + "---:|" * len(sets))
    for name in names:
        cells = [100 * c[name] / (sum(c.values()) or 1) for c in (ours, *shares.values())]
        print(f"| {name} | " + " | ".join(f"{x:.1f}" for x in cells) + " |")
    print("\n| against ustack | top-10 max difference | sampling noise median / 95 % |")
    print("|---|---:|---:|")
    for k, theirs in shares.items():
        median, high, _se = jf.sampling_noise(ours, theirs)
        print(f"| {k} | {jf.worst(jf.compare(ours, theirs)):.1f} | {median:.1f} / {high:.1f} |")


if __name__ == "__main__":
    main()
