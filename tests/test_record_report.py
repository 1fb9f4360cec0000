"""`ustack record` / `report` / `archive`, and count --record: a run saved
now and rendered later gives what the live run printed; after the binaries
moved (--objects, --debug-dir, FILE.objects/), after a rebuild (refused by
build-id, per object), of a -p target, of in-kernel counts, of DWARF runs;
perf's --pid/--tid/--comm filters; bad input as one-line errors.

The programs have known call counts (chain N calls d N times; threads runs
2 threads x N calls), so every count is exact."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import (FIXTURES, O2_NOFP, build, funcs, ok, parse_counts, parse_folded,
                     parse_trace, rebuilt_copy, run_attached, run_ustack, spawn, stop)
from ustack.model import Frame, Stack, StackCount
from ustack.options import Options
from ustack.commands.record import diff_rows, replay_counts
from ustack.report.formats import FORMATS

CHAIN = ["d", "c", "b", "a", "main"]
LIBC_START = ["__libc_start_call_main", "__libc_start_main"]
WAIT = "-"                          # threads: wait for a line on stdin


def done(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """A report/archive run that succeeded, no traceback."""
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    return res


def one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 1, res.stderr
    assert res.stdout in ("", b"")
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ustack: "), res.stderr
    return lines[0]


def run_bytes(*args) -> subprocess.CompletedProcess:
    """run_ustack with stdout as bytes (binary formats), stderr as text."""
    res = run_ustack(*args, text=False)
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout,
                                       res.stderr.decode())


def started(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """ok() for a run whose stdout is bytes."""
    assert res.returncode == 0, res.stderr
    assert res.stderr.startswith("Tracing ") and "Traceback" not in res.stderr
    return res


def private_program(tmp_path: Path, name: str = "chain", flags=None,
                    as_name: str = "chain") -> Path:
    """A copy of a test program in its own directory, which a test may
    move away or rebuild without touching the shared build."""
    binary = build(name, flags=flags) if flags else build(name)
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    copy = directory / as_name
    shutil.copy2(binary, copy)
    return copy


# -- the same run, live and reported -------------------------------------------------

@pytest.mark.kernel
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_count_record_reports_what_count_printed(tmp_path, fmt):
    """One run: count --record prints the live report and saves the run;
    report renders the file, byte for byte the same. DWARF through libc
    (write) without frame pointers: the stacks are unwound while recording."""
    prog = build("chain", flags=O2_NOFP)
    data = tmp_path / "run.data"
    live = started(run_bytes("count", "--record", data, "-f", fmt, "--unwind", "dwarf",
                        "syscall:write", "-c", f"{prog} 7 write"))
    later = done(run_bytes("report", data, "-f", fmt))
    assert later.stdout == live.stdout
    assert later.stdout                          # not two empty reports


@pytest.mark.kernel
def test_record_then_report_is_a_live_count(tmp_path):
    """record (like trace: every event) then report -f text (counted) is
    what a live count of the same program prints; the default report of a
    record run is a stack per event, as trace prints them."""
    prog = build("chain")
    data = tmp_path / "ustack.data"
    rec = ok(run_ustack("record", f"uprobe:{prog}:d", "-c", f"{prog} 9", cwd=tmp_path))
    assert rec.stdout == ""
    assert "Recorded 9 events (1 distinct stacks) in ustack.data" in rec.stderr
    live = ok(run_ustack("count", f"uprobe:{prog}:d", "-c", f"{prog} 9"))
    counted = done(run_ustack("report", "--as", "count", cwd=tmp_path))
    assert counted.stdout == live.stdout
    events = parse_trace(done(run_ustack("report", data)).stdout)
    assert len(events) == 9
    assert {tuple(funcs(e["frames"])[:5]) for e in events} == {tuple(CHAIN)}


@pytest.mark.kernel
def test_dwarf_record_without_frame_pointers(tmp_path):
    prog = build("chain", flags=O2_NOFP)
    data = tmp_path / "run.data"
    ok(run_ustack("record", "--unwind", "dwarf", f"uprobe:{prog}:d", "-c",
                  f"{prog} 6", "-o", data))
    events = parse_trace(done(run_ustack("report", data)).stdout)
    assert [funcs(e["frames"])[:5] for e in events] == [CHAIN] * 6
    folded = parse_folded(done(run_ustack("report", data, "-f", "folded")).stdout)
    assert [(rows[-5:], n) for rows, n in folded] == [(CHAIN[::-1], 6)]


@pytest.mark.kernel
def test_raw_stacks_are_unwound_at_report_time(tmp_path):
    """--raw-stacks keeps the DWARF stack copies (perf.data's way): the
    same stacks, from a larger file."""
    prog = build("chain", flags=O2_NOFP)
    small, raw = tmp_path / "small.data", tmp_path / "raw.data"
    for path, extra in ((small, ()), (raw, ("--raw-stacks",))):
        ok(run_ustack("record", *extra, "--unwind", "dwarf", f"uprobe:{prog}:d",
                      "-c", f"{prog} 20", "-o", path))
    reports = [done(run_ustack("report", p, "-f", "folded")).stdout for p in (small, raw)]
    assert reports[0] == reports[1]
    assert parse_folded(reports[0])[0][1] == 20
    assert raw.stat().st_size > small.stat().st_size


@pytest.mark.kernel
def test_bpf_counts_are_recorded(tmp_path):
    """The kernel counts (no event stream): the recording holds the counts."""
    prog = build("chain")
    data = tmp_path / "run.data"
    rec = ok(run_ustack("record", "--backend", "bpf", f"uprobe:{prog}:d",
                        "-c", f"{prog} 11", "-o", data))
    assert "[backend bpf" in rec.stderr
    assert "Recorded 11 hits counted" in rec.stderr
    stacks = parse_counts(done(run_ustack("report", data)).stdout)
    assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, 11)]
    assert "holds stacks counted in the kernel" in one_line_error(
        run_ustack("report", data, "--as", "trace"))


@pytest.mark.kernel
def test_profile_record(tmp_path):
    """-F HZ records timed samples; their report is counted, as profile's."""
    busy = build("busy")
    data = tmp_path / "run.data"
    ok(run_ustack("record", "-F", "199", "-c", f"{busy} 1", "-o", data))
    stacks = parse_counts(done(run_ustack("report", data)).stdout)
    top = stacks[-1]
    assert top["frames"][:3] == [("spin_here", "busy"), ("work", "busy"), ("main", "busy")]


# -- -p targets and filters ------------------------------------------------------------

@pytest.mark.kernel
def test_pid_run_and_tid_filter(tmp_path):
    """A -p target's binary was mapped before the run: its mappings come
    from /proc, and must be in the file for its frames to be named."""
    prog = private_program(tmp_path, "threads")
    data = tmp_path / "run.data"
    target = spawn(prog, WAIT, 5, stdin=subprocess.PIPE)
    try:
        ok(run_attached(target, "record", f"uprobe:{prog}:thread_d", "-o", data))
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    shutil.rmtree(prog.parent)          # the report must not need /proc or the file
    events = parse_trace(done(run_ustack("report", data)).stdout)
    assert len(events) == 10
    assert all(funcs(e["frames"])[:3] == ["[unknown]"] * 3 for e in events)
    # with the binary back (by build-id, under another name) it is named
    objects = tmp_path / "objects"
    objects.mkdir()
    shutil.copy2(build("threads"), objects / "renamed")
    res = done(run_ustack("report", data, "--objects", objects))
    events = parse_trace(res.stdout)
    assert {tuple(funcs(e["frames"])[:3]) for e in events} == \
        {("thread_d", "thread_a", "worker")}
    assert {e["pid"] for e in events} == {target.pid}
    tids = sorted({e["tid"] for e in events})
    assert len(tids) == 2
    one = done(run_ustack("report", data, "--objects", objects, "-f", "folded",
                          "--tid", tids[0]))
    assert [n for _stack, n in parse_folded(one.stdout)] == [5]
    both = done(run_ustack("report", data, "--objects", objects, "-f", "folded",
                           "--tid", f"{tids[0]},{tids[1]}", "--pid", target.pid))
    assert [n for _stack, n in parse_folded(both.stdout)] == [10]
    none = done(run_ustack("report", data, "--pid", target.pid + 1, "-f", "folded"))
    assert none.stdout == ""


@pytest.mark.kernel
def test_system_wide_run_of_a_process_started_before(tmp_path):
    """No -p: a process that ran before the recording started is known
    from /proc only; its mappings and name are written at its first event,
    so it is named after it exited. (A process that exits before its first
    event is decoded stays unnamed, live or recorded: it is gone from /proc.)"""
    busy = private_program(tmp_path, "busy", as_name="busyrec")
    data = tmp_path / "run.data"
    target = spawn(busy, 2)               # 2 s of its own CPU time: it outlives -d 1
    try:
        ok(run_ustack("record", "-F", "99", "--unwind", "fp", "-d", "1", "-o", data))
        assert target.wait(timeout=60) == 0
    finally:
        stop(target)
    res = done(run_ustack("report", data, "--as", "count", "-P", "--pid", target.pid))
    stacks = parse_counts(res.stdout)
    top = stacks[-1]
    assert top["frames"][:3] == [("spin_here", "busyrec"), ("work", "busyrec"),
                                 ("main", "busyrec")]
    assert (top["comm"], top["pid"]) == ("busyrec", target.pid)
    assert top["count"] > 0.8 * sum(s["count"] for s in stacks)


@pytest.mark.kernel
def test_comm_and_pid_filters_of_two_processes(tmp_path):
    """Two programs under one -c shell, each writing a known number of times."""
    one = private_program(tmp_path, as_name="one")
    two = private_program(tmp_path, as_name="two")
    data = tmp_path / "run.data"
    ok(run_ustack("record", "syscall:write", "-c",
                  f"sh -c '{one} 3 write >/dev/null; {two} 4 write >/dev/null'",
                  "-o", data))

    def by_comm(*args) -> dict:
        out = done(run_ustack("report", data, "-f", "folded", *args)).stdout
        counts: dict = {}
        for stack, n in parse_folded(out):
            if stack[0] in ("one", "two"):
                counts[stack[0]] = counts.get(stack[0], 0) + n
        return counts

    assert by_comm() == {"one": 3, "two": 4}
    assert by_comm("--comm", "two") == {"two": 4}
    assert by_comm("--comm", "one,two") == {"one": 3, "two": 4}
    per_pid = parse_counts(done(run_ustack("report", data, "--as", "count", "-P",
                                           "--comm", "one")).stdout)
    (pid,) = {s["pid"] for s in per_pid}
    assert by_comm("--pid", pid) == {"one": 3}


# -- binaries moved, stripped, rebuilt ---------------------------------------------------

def strip_with_debug_file(binary: Path, debug_root: Path) -> None:
    """binary loses its symbols; they go to debug_root/.build-id/xx/….debug."""
    from ustack.objfile.elf import ElfImage
    build_id = ElfImage.open(str(binary)).build_id
    debug = debug_root / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    debug.parent.mkdir(parents=True)
    subprocess.run(["objcopy", "--only-keep-debug", binary, debug], check=True)
    subprocess.run(["strip", "--strip-all", binary], check=True)


@pytest.mark.kernel
def test_report_elsewhere_with_objects_and_debug_dir(tmp_path):
    prog = private_program(tmp_path)
    debug_root = tmp_path / "debug"
    strip_with_debug_file(prog, debug_root)
    data = tmp_path / "run.data"
    ok(run_ustack("record", "--unwind", "dwarf", "syscall:write", "-c",
                  f"{prog} 4 write", "-o", data))
    moved = tmp_path / "elsewhere"
    shutil.move(prog.parent, moved)
    gone = done(run_ustack("report", data, "-f", "folded"))
    assert f"ustack: {prog} (build-id" in gone.stderr
    assert "is not here" in gone.stderr
    named = done(run_ustack("report", data, "-f", "folded", "--objects", moved,
                            "--debug-dir", debug_root))
    assert named.stderr == ""
    assert [(stack[-6:], n) for stack, n in parse_folded(named.stdout)] == \
        [(CHAIN[::-1] + ["write"], 4)]
    stripped = done(run_ustack("report", data, "-f", "folded", "--objects", moved))
    assert parse_folded(stripped.stdout) != parse_folded(named.stdout)


@pytest.mark.kernel
def test_a_rebuilt_binary_is_refused_and_libc_still_named(tmp_path):
    prog = private_program(tmp_path)
    data = tmp_path / "run.data"
    ok(run_ustack("record", f"uprobe:{prog}:d", "-c", f"{prog} 3", "-o", data))
    rebuilt = rebuilt_copy(prog, tmp_path)          # another build-id, same name
    shutil.move(rebuilt, prog)
    res = done(run_ustack("report", data, "--as", "count"))
    warnings = [l for l in res.stderr.splitlines() if l.startswith("ustack: ")]
    assert len(warnings) == 1, res.stderr
    assert warnings[0].startswith(f"ustack: {prog} here is not the recorded file")
    stacks = parse_counts(res.stdout)
    assert len(stacks) == 1 and stacks[0]["count"] == 3
    frames = stacks[0]["frames"]
    assert frames[:5] == [("[unknown]", "chain")] * 5
    assert frames[5] == (LIBC_START[0], "libc.so.6")     # libc: still named


@pytest.mark.kernel
def test_archive_travels_with_the_recording(tmp_path):
    prog = private_program(tmp_path)
    data = tmp_path / "run.data"
    rec = ok(run_ustack("record", "--archive", f"uprobe:{prog}:d", "-c",
                        f"{prog} 5", "-o", data))
    assert f"in {data}.objects" in rec.stderr
    archived = sorted(p.name for p in (tmp_path / "run.data.objects").iterdir())
    assert "chain" in archived and "libc.so.6" in archived
    shutil.rmtree(prog.parent)
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    shutil.move(data, elsewhere / "run.data")
    shutil.move(f"{data}.objects", elsewhere / "run.data.objects")
    res = done(run_ustack("report", elsewhere / "run.data", "-f", "folded"))
    assert res.stderr == ""
    assert [(stack[-5:], n) for stack, n in parse_folded(res.stdout)] == [(CHAIN[::-1], 5)]


# -- report --diff ----------------------------------------------------------------------

def counted(names, n, comm="chain") -> StackCount:
    return StackCount(comm, 1, Stack(tuple(Frame(0x1000 + i, "chain", f)
                                           for i, f in enumerate(names))), n)


def test_diff_rows_pair_identical_stacks():
    before = [counted(CHAIN, 3), counted(["x"] + CHAIN[1:], 2)]
    after = [counted(CHAIN, 4), counted(CHAIN, 1), counted(["y"], 7)]
    rows = {tuple(f.function for f in r.stack.stack.frames): (r.before, r.after)
            for r in diff_rows(before, after)}
    assert rows == {tuple(CHAIN): (3, 5), ("x", *CHAIN[1:]): (2, 0), ("y",): (0, 7)}


def test_diff_rows_of_two_recordings():
    """The fp count fixture against the DWARF trace fixture: d called 24
    times in each; the stacks differ past main (fp stops in libc)."""
    runs = [replay_counts(str(FIXTURES / name), Options(), (FIXTURES,))[0]
            for name in ("count-d-fp.ustack", "count-d-fp.ustack")]
    rows = diff_rows(*runs)
    assert [(r.before, r.after) for r in rows] == [(24, 24)]
    assert [f.function for f in rows[0].stack.stack.frames][:5] == CHAIN


def test_diff_needs_the_flame_graph_class_or_says_so(tmp_path):
    try:
        import ustack.report.flamegraph_html as flamegraph
        have = hasattr(flamegraph, "DiffFlameGraphReport")
    except ImportError:
        have = False
    fixture = FIXTURES / "count-d-fp.ustack"
    res = run_ustack("report", "--diff", fixture, fixture, "--objects", FIXTURES,
                     "-o", tmp_path / "diff.html")
    if have:
        done(res)
        assert (tmp_path / "diff.html").stat().st_size > 0
    else:
        assert one_line_error(res).startswith("ustack: differential flame graphs need")


@pytest.mark.parametrize("ask, said", [
    (("-f", "folded"), "format 'folded' is not available here (one of html)"),
    (("-f", "pprof", "-o", "{dir}/d.pb.gz"), "format 'pprof' is not available here (one of html)"),
    (("-o", "{dir}/d.svg"), "-o {dir}/d.svg: svg is not a format of this command "
                            "(one of html; or say which with -f)"),
])
def test_diff_refuses_formats_it_cannot_write(tmp_path, ask, said):
    """The differential graph is a page: asked for another format, it says
    so instead of writing HTML under that name."""
    fixture = FIXTURES / "count-d-fp.ustack"
    ask = [a.format(dir=tmp_path) for a in ask]
    res = run_ustack("report", "--diff", fixture, fixture, "--objects", FIXTURES, *ask)
    assert one_line_error(res) == "ustack: " + said.format(dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- bad input ---------------------------------------------------------------------------

def test_report_errors_are_one_line(tmp_path):
    assert "no such recording" in one_line_error(
        run_ustack("report", tmp_path / "nothing.data"))
    assert "no such recording" in one_line_error(run_ustack("report", cwd=tmp_path))
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    assert "not a ustack recording" in one_line_error(run_ustack("report", text))
    fixture = FIXTURES / "count-d-fp.ustack"
    assert "format 'nope' is not available" in one_line_error(
        run_ustack("report", fixture, "-f", "nope"))
    assert "--pid takes numbers" in one_line_error(
        run_ustack("report", fixture, "--pid", "x"))
    damaged = tmp_path / "cut.data"
    damaged.write_bytes(fixture.read_bytes()[:len(fixture.read_bytes()) // 2])
    assert "truncated" in one_line_error(run_ustack("report", damaged))


def test_report_of_a_version_1_fixture_without_root():
    """The fixtures are version 1 (whole samples): still read."""
    res = done(run_ustack("report", FIXTURES / "count-d-fp.ustack",
                          "--objects", FIXTURES))
    stacks = parse_counts(res.stdout)
    assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, 24)]


@pytest.mark.kernel
def test_a_failed_record_leaves_no_file(tmp_path):
    prog = build("chain")
    data = tmp_path / "run.data"
    assert "no function 'nope'" in one_line_error(
        run_ustack("record", f"uprobe:{prog}:nope", "-c", f"{prog} 3", "-o", data))
    assert "no such directory" in one_line_error(
        run_ustack("record", f"uprobe:{prog}:d", "-c", f"{prog} 3",
                   "-o", tmp_path / "missing" / "run.data"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.kernel
def test_record_without_an_event_profiles_at_profiles_rate_and_is_titled_a_profile(tmp_path):
    """`record -c CMD` samples as `profile -c CMD` does (49 Hz), and the
    recording's flame graph is a profile's, not a trace's."""
    busy = build("busy", flags=O2_NOFP)
    data = tmp_path / "run.data"
    res = ok(run_ustack("record", "-o", data, "-c", f"{busy} 1"))
    assert res.stderr.startswith("Tracing profile:hz:49 in ")
    page = tmp_path / "run.html"
    done(run_ustack("report", data, "-o", page))
    assert "<title>ustack profile at 49 Hz</title>" in page.read_text()
    ok(run_ustack("record", "-F", "99", "-o", data, "-c", f"{busy} 1"))
    done(run_ustack("report", data, "-o", page))
    assert "<title>ustack profile at 99 Hz</title>" in page.read_text()
