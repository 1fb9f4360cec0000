"""`ustack profile --every S --to clickhouse://HOST:PORT/DB` and `ustack
report --from clickhouse://…`, against a real clickhouse-server started
here on free loopback ports with a data directory of its own: several
agents at once, the server restarted under them, a server that answers
garbage. What reaches the server is checked against the pprof files the
same runs wrote locally: every interval, its counts, nothing twice."""
from __future__ import annotations

import gzip
import json
import http.server
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter

import pytest

from helpers import (O2_NOFP, build, finish, run_ustack, start_ustack, stop, ustack_env,
                     wait_tracing)
from ustack.report.pprof_proto import Profile

pytestmark = pytest.mark.kernel

CONFIG = "/etc/clickhouse-server/config.xml"
AGENTS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ClickHouse:
    """A clickhouse-server of this test's own: its data under `root`,
    every port free and on 127.0.0.1; stop() and start() keep its data."""

    def __init__(self, root, extra=()):
        if shutil.which("clickhouse-server") is None or not os.path.exists(CONFIG):
            pytest.skip("clickhouse-server is not installed (apt-get install "
                        "clickhouse-server)")
        self.root = root
        self.extra = tuple(extra)            # more of the server's settings
        self.http = free_port()
        self.proc = None
        self.ports = (free_port(), free_port())

    @property
    def url(self) -> str:
        return f"clickhouse://127.0.0.1:{self.http}/ustack"

    def start(self) -> None:
        data = self.root / "data"
        args = [f"--path={data}/", f"--tmp_path={data}/tmp/",
                f"--user_files_path={data}/user_files/",
                f"--format_schema_path={data}/format_schemas/",
                f"--http_port={self.http}", f"--tcp_port={self.ports[0]}",
                f"--interserver_http_port={self.ports[1]}",
                "--listen_host=127.0.0.1", f"--logger.log={self.root}/log",
                f"--logger.errorlog={self.root}/errlog", "--logger.console=0", *self.extra]
        self.proc = subprocess.Popen(["clickhouse-server", f"--config-file={CONFIG}", "--",
                                      *args], cwd=self.root, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "errlog").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/ping",
                                            timeout=1) as r:
                    if r.read() == b"Ok.\n":
                        return
            except OSError:
                pass
            time.sleep(0.05)         # polling the port: up when /ping answers
        pytest.fail("clickhouse-server did not answer /ping within 60 s")

    def stop(self, kill: bool = False) -> None:
        """Stop it (kill: at once, as a crash or a power cut would)."""
        if self.proc is not None and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def query(self, sql: str) -> list:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/",
                                     data=sql.encode(), method="POST")
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        return [line.split("\t") for line in text.splitlines()]


@pytest.fixture
def server(tmp_path):
    ch = ClickHouse(tmp_path)
    ch.start()
    yield ch
    ch.stop()


def interval_totals(directory) -> dict:
    """start_ns -> samples of each pprof file in `directory`."""
    totals = {}
    for path in directory.iterdir():
        p = Profile.FromString(gzip.decompress(path.read_bytes()))
        totals[p.time_nanos] = sum(s.value[0] for s in p.sample)
    return totals


def interval_spans(directory) -> list:
    """(start_ns, duration_ns) of each pprof file in `directory`, in time."""
    spans = []
    for path in directory.iterdir():
        p = Profile.FromString(gzip.decompress(path.read_bytes()))
        spans.append((p.time_nanos, p.duration_nanos))
    return sorted(spans)


def file_stacks(paths) -> Counter:
    """The stacks of pprof files, by function names root first, summed."""
    stacks: Counter = Counter()
    for path in paths:
        p = Profile.FromString(gzip.decompress(path.read_bytes()))
        names = p.string_table
        functions = {f.id: names[f.name] for f in p.function}
        locations = {loc.id: [functions[line.function_id] for line in loc.line]
                     for loc in p.location}
        for s in p.sample:
            leaf_first = [name for lid in s.location_id for name in locations[lid]]
            stacks[tuple(reversed(leaf_first))] += s.value[0]
    return stacks


def folded_stacks(text: str) -> Counter:
    """`-f folded`: comm;root;…;leaf COUNT, the comm left out."""
    stacks: Counter = Counter()
    for line in text.splitlines():
        frames, _, count = line.rpartition(" ")
        stacks[tuple(frames.split(";")[1:])] += int(count)
    return stacks


def agent(server_url: str, label: str, out, queue, busy, *extra):
    # 10 intervals over 10 s: a loaded machine restarts the server in 2-3
    # s, and a sender then waits up to 5 s between tries, which the runs outlast
    return start_ustack("profile", "-F", "99", "--every", "1", "-d", "10",
                        "-o", f"{out}/", "--to", server_url, "--host-label", label,
                        "--queue", str(queue), *extra, "-c", f"{busy} 60")


def wait_for(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout} s")
        time.sleep(0.05)


def queued(queue) -> list:
    return [p for p in queue.iterdir() if p.name.endswith(".json")] if queue.exists() else []


@pytest.fixture(scope="module")
def four_agents_through_a_restart(tmp_path_factory):
    """Four agents, 10 intervals each; the server is killed once they have
    all sent something, and starts again once each has queued an interval."""
    tmp_path = tmp_path_factory.mktemp("agents")
    server = ClickHouse(tmp_path)
    server.start()
    busy = build("busy")
    runs = []
    try:
        for i in range(AGENTS):
            label = f"agent{i}"
            runs.append((label, tmp_path / f"out{i}", tmp_path / f"queue{i}",
                         agent(server.url, label, tmp_path / f"out{i}",
                               tmp_path / f"queue{i}", busy)))
        for run in runs:
            wait_tracing(run[3])

        def every_host_sent():
            try:
                rows = server.query("SELECT uniqExact(host) FROM ustack.samples")
            except OSError:
                return False
            return rows and int(rows[0][0]) == AGENTS
        wait_for(every_host_sent, "every agent's first interval in ClickHouse")
        server.stop(kill=True)
        wait_for(lambda: all(queued(q) for _l, _o, q, _p in runs),
                 "an interval queued by every agent while the server is down")
        server.start()
        errs = {label: finish(proc, timeout=120)[1] for label, _o, _q, proc in runs}
    except BaseException:
        server.stop()
        raise
    finally:
        for run in runs:
            stop(run[3])
    for label, _o, _q, proc in runs:
        assert proc.returncode == 0, errs[label]
    yield server, runs, errs
    server.stop()


def test_four_agents_through_a_restart_lose_nothing_and_send_nothing_twice(
        four_agents_through_a_restart):
    server, runs, errs = four_agents_through_a_restart
    for label, out, queue, _proc in runs:
        local = interval_totals(out)
        # -d 10 of 1 s: about 10 intervals, one after the other. A cut made
        # late on a loaded machine makes one longer and the next shorter (so
        # 9 of them, or an 11th a few ms long): the files tile the run.
        spans = interval_spans(out)
        assert 8 <= len(spans) <= 11, spans
        assert all(abs(start + took - following) < 1000
                   for (start, took), (following, _) in zip(spans, spans[1:])), spans
        rows = server.query("SELECT start_ns, sum(weight) FROM ustack.samples WHERE "
                            f"host = '{label}' GROUP BY start_ns")
        stored = {int(start): int(n) for start, n in rows}
        assert stored == {s: n for s, n in local.items() if n}, (label, errs[label])
        assert not queued(queue), errs[label]
        assert f"ustack: {server.url}: " in errs[label], errs[label]   # it saw it down
        assert "stay queued" not in errs[label]


def test_one_flame_graph_over_four_hosts_is_the_sum_of_their_files(
        four_agents_through_a_restart, tmp_path):
    server, runs, _errs = four_agents_through_a_restart
    everything = run_ustack("report", "--from", server.url, "-f", "folded")
    assert everything.returncode == 0, everything.stderr
    files = [p for _l, out, _q, _p in runs for p in out.iterdir()]
    assert folded_stacks(everything.stdout) == file_stacks(files)
    one = run_ustack("report", "--from", server.url, "-f", "folded", "--host", "agent2")
    assert folded_stacks(one.stdout) == file_stacks(list(runs[2][1].iterdir()))
    pprof = run_ustack("report", "--from", server.url, "-o", str(tmp_path / "all.pb.gz"))
    assert pprof.returncode == 0, pprof.stderr
    assert sum(file_stacks([tmp_path / "all.pb.gz"]).values()) == sum(
        file_stacks(files).values())


def test_stacks_travel_as_their_frames_ids_each_frame_named_once_a_run(
        four_agents_through_a_restart):
    """A stack is stored as its frames' ids (stack_frames) and a frame's
    names once (frames), not a whole stack of names a row: every stack the
    samples name is there, every frame its stacks name, and an agent sends
    a frame's names once a run (once more for an interval it sent again
    after the restart)."""
    server, _runs, _errs = four_agents_through_a_restart
    assert server.query("SELECT count() FROM ustack.samples WHERE stack_id NOT IN "
                        "(SELECT stack_id FROM ustack.stack_frames)") == [["0"]]
    assert server.query("SELECT count() FROM (SELECT DISTINCT arrayJoin(frame_ids) AS f "
                        "FROM ustack.stack_frames) WHERE f NOT IN "
                        "(SELECT frame_id FROM ustack.frames)") == [["0"]]
    assert server.query("SELECT count() FROM ustack.stacks") == [["0"]]
    [[rows, distinct]] = server.query("SELECT count(), uniqExact(frame_id) FROM ustack.frames")
    assert int(distinct) > 0 and int(rows) <= 2 * AGENTS * int(distinct), (rows, distinct)


def test_comm_and_event_filters_keep_what_they_name(four_agents_through_a_restart):
    server, runs, _errs = four_agents_through_a_restart
    files = file_stacks([p for _l, out, _q, _p in runs for p in out.iterdir()])
    kept = run_ustack("report", "--from", server.url, "-f", "folded", "--comm", "busy",
                      "--event", "profile:hz:99")
    assert folded_stacks(kept.stdout) == files, kept.stderr
    none = run_ustack("report", "--from", server.url, "-f", "folded", "--comm", "nosuch")
    assert none.returncode == 0 and none.stdout == ""
    assert "holds no samples these filters keep" in none.stderr
    per_pid = run_ustack("report", "--from", server.url, "-f", "folded", "-P")
    assert len({line.split(";")[0] for line in per_pid.stdout.splitlines()}) == AGENTS


def test_time_ranges_read_back_as_their_files_and_diff(four_agents_through_a_restart):
    server, runs, _errs = four_agents_through_a_restart
    files = {}
    for _l, out, _q, _p in runs:
        for path in out.iterdir():
            files[path] = Profile.FromString(gzip.decompress(path.read_bytes())).time_nanos
    starts = sorted(set(files.values()))
    middle = starts[len(starts) // 2]
    first = [p for p, t in files.items() if t < middle]
    second = [p for p, t in files.items() if t >= middle]
    seconds = f"{middle // 10**9}.{middle % 10**9:09d}"      # exact: no float
    early = run_ustack("report", "--from", server.url, "-f", "folded", "--until", seconds)
    late = run_ustack("report", "--from", server.url, "-f", "folded", "--since", seconds)
    assert folded_stacks(early.stdout) == file_stacks(first)
    assert folded_stacks(late.stdout) == file_stacks(second)
    diff = run_ustack("report", "--from", server.url, "--diff", f"..{seconds}",
                      f"{seconds}..", "-o", "/dev/stdout")
    assert diff.returncode == 0, diff.stderr
    totals = re.search(r"A: ([\d,]+) samples .* B: ([\d,]+) samples", diff.stdout)
    assert totals, diff.stdout[:2000]
    a, b = (int(t.replace(",", "")) for t in totals.groups())
    assert (a, b) == (sum(file_stacks(first).values()), sum(file_stacks(second).values()))


def test_a_diff_of_two_hosts_has_each_host_s_files(four_agents_through_a_restart):
    server, runs, _errs = four_agents_through_a_restart
    diff = run_ustack("report", "--from", server.url, "--diff", "host=agent0", "host=agent3",
                      "-o", "/dev/stdout")
    assert diff.returncode == 0, diff.stderr
    totals = re.search(r"A: ([\d,]+) samples .* B: ([\d,]+) samples", diff.stdout)
    a, b = (int(t.replace(",", "")) for t in totals.groups())
    assert (a, b) == (sum(interval_totals(runs[0][1]).values()),
                      sum(interval_totals(runs[3][1]).values()))


def test_past_its_bound_the_queue_drops_the_oldest_and_says_how_many(tmp_path):
    """No server at all and a queue of 3 KiB: the newest intervals stay,
    the oldest are dropped, and the run counts them."""
    busy, out, queue = build("busy"), tmp_path / "out", tmp_path / "queue"
    res = run_ustack("profile", "-F", "99", "--every", "0.25", "-d", "3", "-o", f"{out}/",
                     "--to", f"clickhouse://127.0.0.1:{free_port()}/ustack",
                     "--host-label", "alone", "--queue", str(queue), "--queue-size",
                     str(3 / 1024), "-c", f"{busy} 60", timeout=120)
    assert res.returncode == 0, res.stderr
    kept = sorted(p.name for p in queued(queue))
    local = sorted(n for s, n in interval_totals(out).items() if n)
    dropped = re.search(r"ustack: (\d+) intervals dropped from the queue .* \(over its "
                        r"3 KiB\)", res.stderr)
    assert dropped and kept, res.stderr
    assert int(dropped.group(1)) + len(kept) == len(local), res.stderr
    assert sum(p.stat().st_size for p in queued(queue)) <= 3 * 1024
    # the newest are the ones kept: the last interval's start is the last name's
    newest = max(interval_totals(out))
    assert kept[-1].startswith(f"{newest:020d}-"), (kept, newest)


def test_a_server_answering_garbage_is_one_line_and_the_intervals_wait(server, tmp_path):
    """An HTTP port that is not ClickHouse: the run says so in one line and
    keeps its intervals queued; the next run with a real server sends them."""
    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"garbage\n")

        def log_message(self, *args):
            pass
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    busy, out, queue = build("busy"), tmp_path / "out", tmp_path / "queue"
    try:
        res = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "2", "-o", f"{out}/",
                         "--to", f"clickhouse://127.0.0.1:{fake.server_address[1]}/ustack",
                         "--host-label", "garbled", "--queue", str(queue),
                         "-c", f"{busy} 60", timeout=120)
    finally:
        fake.shutdown()
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if "not ClickHouse's JSON" in line]
    assert len(said) == 1 and said[0].startswith("ustack: "), res.stderr
    local = {s: n for s, n in interval_totals(out).items() if n}
    assert len(queued(queue)) == len(local) > 0, res.stderr
    # the next run with the same queue and a real server sends them
    assert_sent_by_the_next_run(server, queue, "garbled", local, busy)


def assert_sent_by_the_next_run(server, queue, host: str, local: dict, busy) -> None:
    """A run with the same queue and a real server empties the queue, and
    each interval of the local files (start_ns -> samples) is stored with
    its count: sent, and once."""
    again = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1",
                       "--to", server.url, "--host-label", host, "--queue", str(queue),
                       "-c", f"{busy} 60", timeout=120)
    assert again.returncode == 0, again.stderr
    assert not queued(queue), again.stderr
    rows = server.query("SELECT start_ns, sum(weight) FROM ustack.samples WHERE "
                        f"host = '{host}' GROUP BY start_ns")
    stored = {int(start): int(n) for start, n in rows}
    assert local.items() <= stored.items(), (local, stored)


def test_intervals_a_server_never_answers_stay_queued_when_the_run_ends(server, tmp_path):
    """A server that takes the request and never answers: the interval
    the sender holds, and those after it, are in the queue when the run
    ends (within its second), and the next run sends each of them once."""
    held = []
    listener = socket.create_server(("127.0.0.1", 0))

    def accept_and_hold():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)
    threading.Thread(target=accept_and_hold, daemon=True).start()
    busy, out, queue = build("busy"), tmp_path / "out", tmp_path / "queue"
    try:
        res = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1.5", "-o", f"{out}/",
                         "--to", f"clickhouse://127.0.0.1:{listener.getsockname()[1]}/ustack",
                         "--host-label", "mute", "--queue", str(queue),
                         "-c", f"{busy} 60", timeout=120)
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert res.returncode == 0, res.stderr
    assert held, res.stderr                          # the sender was waiting for it
    local = {s: n for s, n in interval_totals(out).items() if n}
    assert len(queued(queue)) == len(local) > 1, res.stderr
    assert f"{len(local)} stay queued in {queue}" in res.stderr, res.stderr
    assert_sent_by_the_next_run(server, queue, "mute", local, busy)


@pytest.mark.parametrize("args, error", [
    (["--to", "clickhouse://u:secret@127.0.0.1:1/x"], "no credentials in the address"),
    (["--to", "http://127.0.0.1:1/x"], "ustack sends to clickhouse://HOST:PORT/DB"),
    (["--to", "clickhouse://127.0.0.1:1/no-such"], "is not a database name"),
])
def test_a_wrong_address_is_one_line(args, error, tmp_path):
    res = run_ustack("profile", "--every", "1", *args, "-c", "true")
    assert res.returncode != 0
    assert res.stderr.startswith("ustack: ") and error in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr


def test_to_without_every_is_refused():
    res = run_ustack("profile", "--to", "clickhouse://127.0.0.1:1/x", "-c", "true")
    assert res.returncode != 0 and "give --every" in res.stderr, res.stderr


def test_report_from_a_server_that_is_not_there_is_one_line():
    res = run_ustack("report", "--from", f"clickhouse://127.0.0.1:{free_port()}/ustack")
    assert res.returncode != 0
    assert res.stderr.strip().endswith("connection refused (is clickhouse-server "
                                       "running there?)"), res.stderr


def test_credentials_come_from_a_file_as_basic_auth(tmp_path):
    """USTACK_CLICKHOUSE_CREDENTIALS names a user:password file; the server
    sees HTTP basic auth."""
    seen = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(self.headers.get("Authorization"))
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(403)
            self.end_headers()
            self.wfile.write(b"Code: 192, e.displayText() = DB::Exception: Unknown user\n")

        def log_message(self, *args):
            pass
    fake = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    creds = tmp_path / "creds"
    creds.write_text("reader:s3cret\n")
    try:
        res = subprocess.run([sys.executable, "-m", "ustack", "report", "--from",
                              f"clickhouse://127.0.0.1:{fake.server_address[1]}/ustack"],
                             env=dict(ustack_env(), USTACK_CLICKHOUSE_CREDENTIALS=str(creds)),
                             capture_output=True, text=True, timeout=60)
    finally:
        fake.shutdown()
    assert seen and seen[0] == "Basic cmVhZGVyOnMzY3JldA==", seen
    assert res.returncode != 0 and "HTTP 403: Code: 192" in res.stderr, res.stderr


def test_nothing_of_clickhouse_is_imported_until_an_address_is_given():
    """A run refused before --to's address is read has loaded nothing of
    the ClickHouse sink (nor http.client): a run without --to pays nothing."""
    code = ("import sys; from ustack.cli import main; "
            "status = main(['profile', '--every', '1', '--to', 'udp://x', '-c', 'true']); "
            "print(status, [m for m in sys.modules if 'sinks' in m or m == 'http.client'])")
    res = subprocess.run([sys.executable, "-c", code], env=ustack_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "1 []", res.stdout + res.stderr
    assert "ustack sends to clickhouse://HOST:PORT/DB" in res.stderr, res.stderr


@pytest.mark.parametrize("table", ["stacks", "stack_frames"])
def test_a_report_over_many_stacks_reads_them_all(server, table):
    """More distinct stacks than one query can list (ClickHouse parses
    256 KiB of query text): 15,000 of them, each with its 20-digit id, as
    an older ustack stored them (stacks: the frames' names) or as frame
    ids (stack_frames, the names in frames)."""
    from ustack.report.sinks.clickhouse_schema import create_statements
    for statement in create_statements("ustack"):
        server.query(statement)
    n = 15_000
    base = 10_000_000_000_000_000_000          # 20 digits
    if table == "stacks":
        server.query(f"INSERT INTO ustack.stacks SELECT {base} + number, "
                     "[concat('f', toString(number))], ['m'], [''], [toUInt32(0)], "
                     f"['native'], [toUInt8(0)], emptyArrayString() FROM numbers({n})")
    else:
        server.query("INSERT INTO ustack.frames SELECT number, concat('f', toString(number)), "
                     f"'m', '', 0, 'native', 0 FROM numbers({n})")
        server.query(f"INSERT INTO ustack.stack_frames SELECT {base} + number, [number], "
                     f"emptyArrayString() FROM numbers({n})")
    server.query("INSERT INTO ustack.samples SELECT toDateTime(1764000000), "
                 "1764000000000000000, 60000000000, 'h', '', 1, 0, 'c', '', '', "
                 f"'profile:hz:49', 1, {base} + number, 'b' FROM numbers({n})")
    res = run_ustack("report", "--from", server.url, "-f", "folded")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == n and "stack not stored" not in res.stdout, res.stdout[-300:]


def test_a_stack_whose_frame_did_not_arrive_shows_where_it_is_missing(server):
    """A stack stored as its frames' ids, one of whose frames rows is not
    there (a server emptied during a run: a run sends a frame's names
    once): the stack is read, that frame named as not stored."""
    from ustack.report.sinks.clickhouse_schema import create_statements
    for statement in create_statements("ustack"):
        server.query(statement)
    server.query("INSERT INTO ustack.frames VALUES (11, 'serve', 'm', '', 0, 'native', 0), "
                 "(13, 'main', 'm', 'main.c', 7, 'native', 0)")
    server.query("INSERT INTO ustack.stack_frames VALUES (5, [11, 12, 13], [])")
    server.query("INSERT INTO ustack.samples VALUES (toDateTime(1764000000), "
                 "1764000000000000000, 1000000000, 'h', '', 1, 0, 'web', '', '', "
                 "'profile:hz:49', 4, 5, 'b')")
    res = run_ustack("report", "--from", server.url, "-f", "folded")
    assert res.stdout.splitlines() == ["web;main;(frame_not_stored);serve 4"], res.stderr


def test_container_filter_keeps_its_container_by_id_or_prefix(server):
    from ustack.report.sinks.clickhouse_schema import create_statements
    for statement in create_statements("ustack"):
        server.query(statement)
    web, db = "a1" * 32, "b2" * 32
    server.query("INSERT INTO ustack.stacks VALUES (1, ['serve'], ['m'], [''], [0], "
                 "['native'], [0], []), (2, ['query'], ['m'], [''], [0], ['native'], [0], [])")
    server.query("INSERT INTO ustack.samples VALUES "
                 f"(1764000000, 1764000000000000000, 1, 'h', '{web}', 1, 0, 'web', '', '', "
                 "'profile:hz:49', 3, 1, 'b'), "
                 f"(1764000000, 1764000000000000000, 1, 'h', '{db}', 2, 0, 'db', '', '', "
                 "'profile:hz:49', 5, 2, 'b'), "
                 "(1764000000, 1764000000000000000, 1, 'h', '', 3, 0, 'host', '', '', "
                 "'profile:hz:49', 7, 1, 'b')")
    for wanted in (web, web[:12]):
        res = run_ustack("report", "--from", server.url, "-f", "folded", "--container", wanted)
        assert res.returncode == 0, res.stderr
        assert res.stdout.splitlines() == ["web;serve 3"], res.stdout
    both = run_ustack("report", "--from", server.url, "-f", "folded",
                      "--container", f"{web[:12]},{db[:12]}")
    assert sorted(both.stdout.splitlines()) == ["db;query 5", "web;serve 3"], both.stdout


@pytest.mark.parametrize("table, start_of", [("sums_hourly", "toStartOfHour"),
                                             ("sums_daily", "toStartOfDay")])
def test_every_insert_feeds_the_sums_exactly(four_agents_through_a_restart, table, start_of):
    """sums_hourly and sums_daily (what a query over all hosts reads)
    hold, period by period and stack by stack, exactly what the samples
    hold: the restart's intervals too, which a server killed mid-insert
    may have kept in some tables and lost from others."""
    server, _runs, _errs = four_agents_through_a_restart
    raw = server.query(f"SELECT {start_of}(time) AS s, event, comm, stack_id, sum(weight), "
                       "count() FROM ustack.samples GROUP BY s, event, comm, stack_id "
                       "ORDER BY s, event, comm, stack_id")
    summed = server.query(f"SELECT start, event, comm, stack_id, sum(weight), sum(rows) "
                          f"FROM ustack.{table} WHERE batches = 0 "
                          "GROUP BY start, event, comm, stack_id "
                          "ORDER BY start, event, comm, stack_id")
    assert raw
    assert summed == raw
    # one marker per interval sent, none twice
    markers = server.query(f"SELECT comm, sum(batches) FROM ustack.{table} "
                           "WHERE batches > 0 GROUP BY comm ORDER BY comm")
    batches = server.query("SELECT batch, 1 FROM ustack.samples GROUP BY batch ORDER BY batch")
    assert markers == batches


def test_periods_the_sums_lack_or_miscount_are_read_from_the_samples(server):
    """An older database (rows before the views existed) and an hour whose
    sums are off (an insert that reached one table of two): the answer is
    the samples' all the same."""
    from ustack.report.sinks.clickhouse_schema import create_statements
    statements = create_statements("ustack")
    for statement in statements[:3]:                 # the database as an older ustack made it
        server.query(statement)
    server.query("INSERT INTO ustack.stacks VALUES (1, ['serve'], ['m'], [''], [0], "
                 "['native'], [0], [])")

    def rows(hour: int, weight: int, table: str = "samples_in") -> None:
        start = 1764000000 + hour * 3600
        server.query(f"INSERT INTO ustack.{table} VALUES "
                     f"({start}, {start}000000000, 1, 'h', '', 1, 0, 'web', '', '', "
                     f"'profile:hz:49', {weight}, 1, 'b{hour}')")
    rows(0, 3, "samples")                            # before the views
    for statement in statements:
        server.query(statement)
    rows(1, 5)
    rows(2, 7)
    hour2 = 1764000000 + 2 * 3600            # hour 2 counted twice
    server.query(f"INSERT INTO ustack.sums_hourly VALUES ({hour2}, 'profile:hz:49', "
                 "'web', 1, 7, 1, 0)")
    server.query("INSERT INTO ustack.sums_daily SELECT toStartOfDay(toDateTime("
                 f"{hour2})), 'profile:hz:49', 'web', 1, 7, 1, 0")   # its day: as many rows
    res = run_ustack("report", "--from", server.url, "-f", "folded")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["web;serve 15"], res.stdout
    since = run_ustack("report", "--from", server.url, "-f", "folded",
                       "--since", str(1764000000 + 1800))     # half of hour 0 left out
    assert since.stdout.splitlines() == ["web;serve 12"], since.stdout


def test_a_range_cutting_hours_reads_its_ends_from_the_samples(server):
    """Every hour proven in sums_hourly: the part-hours at a range's
    ends come from the samples, the whole hours from the sums."""
    from ustack.report.sinks.clickhouse_schema import create_statements
    for statement in create_statements("ustack"):
        server.query(statement)
    server.query("INSERT INTO ustack.stacks VALUES (1, ['serve'], ['m'], [''], [0], "
                 "['native'], [0], [])")
    base = 1764000000                                 # an hour's start
    for at, weight in ((0, 1), (1800, 2), (3600, 4), (5400, 8), (7200, 16)):
        server.query("INSERT INTO ustack.samples_in VALUES "
                     f"({base + at}, {base + at}000000000, 1, 'h', '', 1, 0, 'web', '', '', "
                     f"'profile:hz:49', {weight}, 1, 'b{at}')")
    for since, until, total in ((900, None, 30), (None, 5400, 7), (1800, 5401, 14),
                                (0, 7200, 15), (3600, 3601, 4)):
        args = (["--since", str(base + since)] if since is not None else []) + (
            ["--until", str(base + until)] if until is not None else [])
        res = run_ustack("report", "--from", server.url, "-f", "folded", *args)
        assert res.stdout.splitlines() == [f"web;serve {total}"], (args, res.stderr)


@pytest.mark.parametrize("kept", ["samples", "sums_hourly"])
def test_an_interval_the_server_kept_in_part_is_completed_exactly(server, tmp_path, kept):
    """An interval a killed server kept in one table and lost from the
    others (its samples only, or its hourly sums only), still queued by
    the run that sent it: the next run writes exactly the missing parts,
    and every table then holds it once."""
    from ustack.report.sinks.clickhouse_schema import create_statements
    from ustack.report.sinks.clickhouse_sink import queued_interval
    for statement in create_statements("ustack"):
        server.query(statement)
    start = 1764000000
    row = {"time": start, "start_ns": start * 10**9, "duration_ns": 10**9, "host": "h1",
           "container": "", "pid": 7, "tid": 0, "comm": "web", "executable": "",
           "build_id": "", "event": "profile:hz:49", "weight": 5, "stack_id": 1,
           "batch": f"h1/0ld0run0/{start * 10**9}"}
    rows = [row, dict(row, stack_id=2, weight=3)]
    batch = {"batch": row["batch"], "host": "h1", "start_ns": row["start_ns"],
             "stacks": {}, "samples": "".join(json.dumps(r) + "\n" for r in rows).encode()}
    queue = tmp_path / "queue"
    queue.mkdir(mode=0o700)
    (queue / f"{start * 10**9:020d}-0ld0run0.json").write_bytes(queued_interval(batch))
    # what the server kept of it before it died
    kept_rows = "(1764000000, 'profile:hz:49', 'web', {0}, {1}, 1, 0)"
    if kept == "samples":
        server.query("INSERT INTO ustack.samples FORMAT JSONEachRow\n" + "\n".join(
            json.dumps(r) for r in rows))
    else:
        server.query("INSERT INTO ustack.sums_hourly VALUES "
                     f"{kept_rows.format(1, 5)}, {kept_rows.format(2, 3)}, "
                     f"(1764000000, '', '{row['batch']}', 0, 0, 0, 1)")
    res = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1", "--to", server.url,
                     "--host-label", "h2", "--queue", str(queue), "-c", f"{build('busy')} 60",
                     timeout=120)
    assert res.returncode == 0, res.stderr
    assert not queued(queue), res.stderr
    samples = server.query("SELECT stack_id, sum(weight), count() FROM ustack.samples "
                           "WHERE host = 'h1' GROUP BY stack_id ORDER BY stack_id")
    assert samples == [["1", "5", "1"], ["2", "3", "1"]]
    for table in ("sums_hourly", "sums_daily"):
        summed = server.query(f"SELECT stack_id, sum(weight), sum(rows) FROM ustack.{table} "
                              "WHERE comm = 'web' AND batches = 0 GROUP BY stack_id "
                              "ORDER BY stack_id")
        assert summed == samples, table
        markers = server.query(f"SELECT sum(batches) FROM ustack.{table} "
                               f"WHERE comm = '{row['batch']}'")
        assert markers == [["1"]], table


def test_an_interval_queued_by_an_older_ustack_goes_in_with_its_stacks(server, tmp_path):
    """A queue file an older ustack left: its stacks rows are the stacks
    table's own columns (no stacks_in then), and its header names no
    table: they go into stacks as they are, and the interval reads back."""
    start = 1764100000
    row = {"time": start, "start_ns": start * 10**9, "duration_ns": 10**9, "host": "old1",
           "container": "", "pid": 7, "tid": 0, "comm": "web", "executable": "",
           "build_id": "", "event": "profile:hz:49", "weight": 5, "stack_id": 9,
           "batch": f"old1/0ld0run0/{start * 10**9}"}
    stacks = (b'{"function":["serve","main"],"module":["m","m"],"file":["",""],'
              b'"line":[0,0],"language":["native","native"],"inlined":[0,0],'
              b'"notes":[],"stack_id":9}\n')
    samples = json.dumps(row).encode() + b"\n"
    header = {"batch": row["batch"], "host": "old1", "start_ns": row["start_ns"],
              "stack_ids": [9], "stacks_bytes": len(stacks), "samples_bytes": len(samples)}
    queue = tmp_path / "queue"
    queue.mkdir(mode=0o700)
    (queue / f"{start * 10**9:020d}-0ld0run0.json").write_bytes(
        json.dumps(header).encode() + b"\n" + stacks + samples)
    res = run_ustack("profile", "-F", "99", "--every", "0.5", "-d", "1", "--to", server.url,
                     "--host-label", "h2", "--queue", str(queue), "-c", f"{build('busy')} 60",
                     timeout=120)
    assert res.returncode == 0, res.stderr
    assert not queued(queue), res.stderr
    read = run_ustack("report", "--from", server.url, "--host", "old1", "-f", "folded")
    assert read.stdout.splitlines() == ["web;main;serve 5"], read.stderr


def test_offcpu_every_sends_each_interval_s_time_off_the_cpu(server, tmp_path):
    """offcpu --every --to: each interval's blocked stacks weighted by
    their nanoseconds off the CPU, in the pprof files (offcpu/nanoseconds)
    and in ClickHouse alike, interval by interval; the naps' time, summed
    over the intervals, is what the program slept (nothing counted twice
    across a cut: the kernel's sums are taken out at each)."""
    naps, out, queue = build("naps", flags=O2_NOFP), tmp_path / "out", tmp_path / "queue"
    res = run_ustack("offcpu", "--state", "S", "--every", "0.5", "-o", f"{out}/",
                     "--to", server.url, "--host-label", "sleeper", "--queue", str(queue),
                     "-c", f"{naps} 0 40 50", timeout=120)
    assert res.returncode == 0, res.stderr
    _pid, n, ms = res.stdout.split()
    assert int(n) == 40 and not queued(queue), res.stderr
    units, local = set(), {}
    for path in out.iterdir():
        p = Profile.FromString(gzip.decompress(path.read_bytes()))
        units.add(tuple((p.string_table[t.type], p.string_table[t.unit])
                        for t in p.sample_type))
        local[p.time_nanos] = sum(s.value[0] for s in p.sample)
    assert units == {(("offcpu", "nanoseconds"),)}
    assert len(local) >= 3, local                  # ~2 s of naps in 0.5 s intervals
    rows = server.query("SELECT start_ns, sum(weight), any(event) FROM ustack.samples "
                        "WHERE host = 'sleeper' GROUP BY start_ns")
    assert {int(start): int(w) for start, w, _e in rows} == {
        t: w for t, w in local.items() if w}
    assert {e for _s, _w, e in rows} == {"offcpu"}
    napped = sum(w for stack, w in file_stacks(out.iterdir()).items() if "nap_fn" in stack)
    assert 0.99 * 40 * 50e6 <= napped <= (float(ms) + 1) * 1e6, (napped, ms)
    stored = folded_stacks(run_ustack("report", "--from", server.url, "-f", "folded",
                                      "--event", "offcpu").stdout)
    assert sum(w for stack, w in stored.items() if "nap_fn" in stack) == napped


def test_offcpu_every_with_wakers_is_refused(tmp_path):
    res = run_ustack("offcpu", "--every", "1", "--wakers", "-o", f"{tmp_path}/", "-c", "true")
    assert res.returncode != 0
    assert res.stderr.strip().splitlines() == [
        "ustack: --every counts each interval's blocked stacks; the wakers' are not kept "
        "per interval (drop --wakers)"], res.stderr
