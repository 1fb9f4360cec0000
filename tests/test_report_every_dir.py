"""`ustack report --from DIR/`: the pprof files of one real `profile
--every -o DIR/` run read back with the filters and --diff of
`--from clickhouse://`, no server needed. The oracle is the files
themselves, read with `go tool pprof` (which merges several profiles)
where it is installed, else with the protobuf reader."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import subprocess
from collections import Counter

import pytest

from helpers import build, fail_one_line, ok, run_ustack, traced_pid
from ustack.report.pprof_proto import Profile

pytestmark = pytest.mark.kernel

LABEL = "web7"


@pytest.fixture(scope="module")
def every_run(tmp_path_factory):
    """One run of 8 or so intervals of 0.4 s: (its directory, the files
    by start_ns, the traced pid)."""
    out = tmp_path_factory.mktemp("every") / "profiles"
    res = ok(run_ustack("profile", "-F", "99", "--every", "0.4", "-d", "3.2",
                        "-o", f"{out}/", "--host-label", LABEL,
                        "-c", f"{build('busy')} 60", timeout=180))
    files = {}
    for path in out.iterdir():
        files[Profile.FromString(gzip.decompress(path.read_bytes())).time_nanos] = path
    assert len(files) >= 4, res.stderr
    return out, files, traced_pid(res.stderr)


def file_stacks(paths) -> Counter:
    """The files' stacks (function names, root first) and their samples,
    summed: by `go tool pprof -traces` over them all when Go is here."""
    if shutil.which("go"):
        text = subprocess.run(["go", "tool", "pprof", "-sample_index=samples", "-traces",
                               *map(str, paths)], capture_output=True, text=True,
                              timeout=120, check=True).stdout
        stacks: Counter = Counter()
        for block in text.split("-----------+")[1:]:
            lines = [ln for ln in block.splitlines()[1:]    # not the labels (comm: busy)
                     if ln.strip() and not re.match(r"\s*\w+:\s", ln)]
            if not lines:
                continue
            count, leaf = lines[0].split(None, 1)
            names = [leaf.strip()] + [ln.strip() for ln in lines[1:]]
            stacks[tuple(reversed(names))] += int(count)
        return stacks
    stacks = Counter()
    for path in paths:
        p = Profile.FromString(gzip.decompress(path.read_bytes()))
        names = p.string_table
        functions = {f.id: names[f.name] for f in p.function}
        locations = {loc.id: [functions[line.function_id] for line in loc.line]
                     for loc in p.location}
        for s in p.sample:
            leaf_first = [n for lid in s.location_id for n in locations[lid]]
            stacks[tuple(reversed(leaf_first))] += s.value[0]
    return stacks


def folded_stacks(text: str) -> Counter:
    """`-f folded`: comm;root;…;leaf COUNT, the comm left out."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        stacks[tuple(frames.split(";")[1:])] += int(count)
    return stacks


def seconds(ns: int) -> str:
    return f"{ns // 10**9}.{ns % 10**9:09d}"         # exact: no float


def report(directory, *args) -> subprocess.CompletedProcess:
    res = run_ustack("report", "--from", f"{directory}/", *args, timeout=120)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    return res


def test_a_flame_graph_over_a_range_is_the_sum_of_its_files(every_run):
    out, files, _pid = every_run
    starts = sorted(files)
    since, until = starts[1], starts[-2]             # a range inside the run
    kept = [files[s] for s in starts if since <= s < until]
    ranged = report(out, "-f", "folded", "--since", seconds(since), "--until", seconds(until))
    assert folded_stacks(ranged.stdout) == file_stacks(kept)
    everything = report(out, "-f", "folded")
    assert folded_stacks(everything.stdout) == file_stacks(files.values())


def test_the_files_host_pid_comm_and_event_filter_as_the_server_s_rows(every_run):
    out, files, pid = every_run
    whole = folded_stacks(report(out, "-f", "folded").stdout)
    assert sum(whole.values()) > 0
    for kept in (["--host", LABEL], ["--pid", str(pid)], ["--comm", "busy"],
                 ["--event", "profile:hz:99"]):
        assert folded_stacks(report(out, "-f", "folded", *kept).stdout) == whole, kept
    for none in (["--host", "db1"], ["--pid", str(pid + 1)], ["--comm", "nosuch"],
                 ["--event", "syscall:write"]):
        res = report(out, "-f", "folded", *none)
        assert res.stdout == "" and "holds no samples these filters keep" in res.stderr, none


@pytest.mark.parametrize("fmt", ["text", "html", "svg", "pprof", "speedscope", "json"])
def test_every_counted_format_reads_a_directory(every_run, fmt, tmp_path):
    out, files, _pid = every_run
    total = sum(file_stacks(files.values()).values())
    written = tmp_path / f"all.{fmt}"
    report(out, "-f", fmt, "-o", str(written))
    data = written.read_bytes()
    if fmt == "pprof":
        assert sum(file_stacks([written]).values()) == total
    elif fmt == "json":
        assert sum(s["count"] for s in json.loads(data)["stacks"]) == total
    else:
        assert b"spin_here" in data


def test_a_diff_of_two_ranges_is_the_diff_of_their_files(every_run):
    out, files, _pid = every_run
    starts = sorted(files)
    middle = starts[len(starts) // 2]
    diff = report(out, "--diff", f"..{seconds(middle)}", f"{seconds(middle)}..",
                  "-o", "/dev/stdout")
    totals = re.search(r"A: ([\d,]+) samples .* B: ([\d,]+) samples", diff.stdout)
    assert totals, diff.stdout[:2000]
    a, b = (int(t.replace(",", "")) for t in totals.groups())
    assert (a, b) == (sum(file_stacks([files[s] for s in starts if s < middle]).values()),
                      sum(file_stacks([files[s] for s in starts if s >= middle]).values()))


def test_bad_input_is_one_line(every_run, tmp_path):
    out, files, _pid = every_run
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no pprof files of --every in it" in fail_one_line(
        run_ustack("report", "--from", f"{empty}/"))
    assert "No such file or directory" in fail_one_line(
        run_ustack("report", "--from", f"{tmp_path}/nowhere/"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "profile-20261129T041500.000Z.pb.gz").write_bytes(b"\x1f\x8bnot gzip")
    message = fail_one_line(run_ustack("report", "--from", f"{broken}/"))
    assert "profile-20261129T041500.000Z.pb.gz: not a pprof file" in message, message
    assert "not by container" in fail_one_line(
        run_ustack("report", "--from", f"{out}/", "--container", "abc"))
    assert "a time is seconds since the epoch" in fail_one_line(
        run_ustack("report", "--from", f"{out}/", "--since", "yesterday"))
