"""`ustack profile --every SECONDS -o DIR/`: continuous profiling, a pprof
file per interval, read back by `go tool pprof` as Pyroscope or Parca
would take them in: one interval after another, together the samples of
one profile of the same run, each saying what ustack itself cost."""
from __future__ import annotations

import gzip
import re
import signal
import time

import pytest

from helpers import build, finish, pprof, run_ustack, start_ustack, stop, wait_tracing
from ustack.report.pprof_proto import Profile

pytestmark = pytest.mark.kernel

NAME = re.compile(r"profile-\d{8}T\d{6}\.\d{3}Z\.pb\.gz")
COST = re.compile(r"ustack's own CPU: (\d+\.\d+) s over (\d+\.\d+) s \(\d+\.\d+ % of one "
                  r"CPU, \d+\.\d+ % of the machine's \d+\)")


def seconds_of(top: str) -> float:
    """A profile's duration as `go tool pprof -top` heads it: 1.02s, 534ms."""
    number, unit = re.search(r"^Duration: ([\d.]+)(ms|s),", top, re.M).groups()
    return float(number) / (1000 if unit == "ms" else 1)


def test_a_pprof_per_interval_adds_up_to_the_profile(tmp_path):
    """busy spins 2.5 s of CPU: at 99 Hz ~247 samples in all, spread over
    one file per second, each a profile of its own second."""
    busy, out = build("busy"), tmp_path / "profiles"
    res = run_ustack("profile", "-F", "99", "--every", "1s", "-o", f"{out}/",
                     "-c", f"{busy} 2.5", timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"a pprof file every 1 s into {out}/" in res.stderr.splitlines()[0]
    names = sorted(p.name for p in out.iterdir())
    assert len(names) >= 3 and all(NAME.fullmatch(n) for n in names), names
    total = 0
    for name in names:
        top = pprof("-top", out / name)
        comments = pprof("-raw", out / name)
        cost = COST.search(comments)
        assert cost and "ustack's memory: " in comments, comments[:400]
        assert float(cost.group(2)) > 0
        rows = [line.split() for line in top.splitlines() if line.strip().endswith("spin_here")]
        samples = re.search(r"Total samples = ([\d.]+)(ms|s)", top)
        ms = float(samples.group(1)) * (1000 if samples.group(2) == "s" else 1) if samples else 0
        total += round(ms / (1000 / 99))
        if name != names[-1]:
            assert rows, top                    # spinning the whole second
    assert 0.85 * 247 <= total <= 1.1 * 247, total


def test_duration_of_whole_intervals_makes_that_many_files(tmp_path):
    """-d 2 with 1 s intervals: two files, one second each (the intervals
    count from the run's start; the one due as the run ends is the last)."""
    busy, out = build("busy"), tmp_path / "profiles"
    res = run_ustack("profile", "-F", "99", "--every", "1", "-d", "2", "-o", f"{out}/",
                     "-c", f"{busy} 60", timeout=120)
    assert res.returncode == 0, res.stderr
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 2, names
    durations = [seconds_of(pprof("-top", out / n)) for n in names]
    assert all(0.8 <= d <= 1.2 for d in durations), durations


def test_ctrl_c_writes_the_interval_under_way(tmp_path):
    busy, out = build("busy"), tmp_path / "profiles"
    us = start_ustack("profile", "-F", "99", "--every", "600", "-o", f"{out}/",
                      "-c", f"{busy} 60")
    try:
        wait_tracing(us)
        us.send_signal(signal.SIGINT)
        err = finish(us)[1]
    finally:
        stop(us)
    assert us.returncode == 0, err
    (only,) = list(out.iterdir())
    assert NAME.fullmatch(only.name)
    pprof("-top", only)
    partial = [c for c in comments_of(read_profile(only)) if c.startswith("a partial")]
    assert partial and re.fullmatch(r"a partial interval: \d+\.\d{3} s of 600 s, "
                                    r"the run ended \(interrupted\)", partial[0]), partial
    assert f"{only.name}: {partial[0]}\n" in err


def read_profile(path) -> Profile:
    return Profile.FromString(gzip.decompress(path.read_bytes()))


def comments_of(profile: Profile) -> list:
    return [profile.string_table[i] for i in profile.comment]


def functions_sampled(profile: Profile) -> set:
    names = {f.id: profile.string_table[f.name] for f in profile.function}
    lines = {loc.id: [names[line.function_id] for line in loc.line]
             for loc in profile.location}
    return {name for sample in profile.sample for loc in sample.location_id
            for name in lines[loc]}


def lines_written(path, at_least: int, timeout: float = 30) -> list:
    """The lines of a file a program adds to, once it has `at_least`."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= at_least:
            return lines
        time.sleep(0.01)
    pytest.fail(f"{path} has fewer than {at_least} lines after {timeout} s")


def test_each_interval_holds_the_samples_taken_in_it(tmp_path):
    """phases runs 30 functions one after another, 100 ms each, and says
    when each ran. ustack is held still (SIGSTOP) for most of them: resumed,
    it reads a backlog of samples, which still go to the files of the
    intervals they were taken in: every function in a file ran within the
    file's stated time and duration."""
    phases, out, log = build("phases"), tmp_path / "profiles", tmp_path / "phases.txt"
    us = start_ustack("profile", "-F", "199", "--every", "1", "--backend", "perf",
                      "--unwind", "fp", "-o", f"{out}/", "-c", f"{phases} 30 100 {log}")
    try:
        wait_tracing(us)
        lines_written(log, 2)
        us.send_signal(signal.SIGSTOP)
        try:
            lines_written(log, 20)
        finally:
            us.send_signal(signal.SIGCONT)
        err = finish(us)[1]
    finally:
        stop(us)
    assert us.returncode == 0, err
    ran = {f"phase_{i}": (int(start), int(end))
           for i, start, end in (line.split() for line in lines_written(log, 30))}
    seen = set()
    for path in sorted(out.iterdir()):
        profile = read_profile(path)
        begin, end = profile.time_nanos, profile.time_nanos + profile.duration_nanos
        sampled = functions_sampled(profile) & ran.keys()
        for name in sampled:
            started, ended = ran[name]
            # a function's samples were taken while it ran (within 2 ms)
            assert started - 2_000_000 < end and begin < ended + 2_000_000, (
                path.name, name, begin, end, ran[name])
        seen |= sampled
    # most phases get a sample even on a busy machine (199 Hz: ~20 a phase)
    assert len(seen) >= 10, sorted(seen)


def test_into_an_existing_directory_beside_other_files(tmp_path):
    """A directory the user made (an agent's drop box): other files stay."""
    (tmp_path / "keep.txt").write_text("mine")
    res = run_ustack("profile", "--every", "5", "-d", "0.5", "-o", str(tmp_path),
                     "-c", "true")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert len([p for p in tmp_path.iterdir() if NAME.fullmatch(p.name)]) == 1


@pytest.mark.parametrize("args, message", [
    (("--every", "0", "-o", "{d}/"), "ustack: --every must be a positive number of seconds"),
    (("--every", "10"), "ustack: --every writes a pprof file per interval: name their "
                        "directory with -o DIR/"),
    (("--every", "10", "-f", "folded", "-o", "{d}/"), "ustack: --every writes pprof files, "
                                                       "not folded"),
    (("--every", "10", "--record", "{d}/r.data", "-o", "{d}/"),
     "ustack: --every writes pprof files; it is not recorded (drop --record)"),
    (("--every", "10", "-o", "{d}/file"), "ustack: -o {d}/file is not a directory: --every "
                                          "writes a file per interval into one"),
    (("--every", "ten", "-o", "{d}/"), "ustack: argument --every: invalid seconds value: "
                                       "'ten' (see `ustack profile --help`)"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    (tmp_path / "file").write_text("")
    res = run_ustack("profile", *(a.format(d=tmp_path) for a in args), "-c", "true")
    assert res.returncode in (1, 2) and res.stdout == ""
    assert res.stderr == message.format(d=tmp_path) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
