"""`profile --every --to clickhouse://…` at scale, against a private
clickhouse-server (Debian's 18.16) on free loopback ports:

1. one host's rows and bytes per hour: a whole-machine profile (-F 49,
   --every 60, -d SECONDS) sent to the server; rows, distinct stacks and
   bytes on disk (system.parts, after OPTIMIZE ... FINAL merged the
   parts as the server does over time) scaled to an hour; and what
   sending cost the agent in CPU (its own count: the sampling thread's
   queueing plus the sender thread), as a share of the machine, beside
   the whole agent's CPU with --to and without it (-o DIR/ only), the
   two runs one after the other;
2. queries over 10 million synthetic interval rows (50 hosts x 1000
   intervals x 200 stacks, 5000 distinct stacks of 20 frames): the wall
   time of `ustack report --from` (Python's start-up included), best of 3.

    python3 bench/clickhouse.py [SECONDS]   (default 120; root: the whole machine;
                                             0: the queries only)

3. `sending SECONDS PAIRS [OTHER_SRC]`: only the agent's CPU, in
   alternated pairs of whole-machine runs (-F 49 --every 20): -o DIR/
   then --to (each into a database of its own, so every stack is new to
   it); with OTHER_SRC (another tree's src/), that tree's --to then this
   one's. Each run: its whole CPU, the CPU its sink counts for sending,
   the stacks it sent, and so the sending CPU per new stack.
"""
from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
CONFIG = "/etc/clickhouse-server/config.xml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: str) -> tuple:
    http, tcp, inter = free_port(), free_port(), free_port()
    data = os.path.join(root, "data")
    proc = subprocess.Popen(
        ["clickhouse-server", f"--config-file={CONFIG}", "--", f"--path={data}/",
         f"--tmp_path={data}/tmp/", f"--user_files_path={data}/user_files/",
         f"--format_schema_path={data}/format_schemas/", f"--http_port={http}",
         f"--tcp_port={tcp}", f"--interserver_http_port={inter}", "--listen_host=127.0.0.1",
         f"--logger.log={root}/log", f"--logger.errorlog={root}/errlog",
         "--logger.console=0"], cwd=root, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    for _ in range(1200):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/ping", timeout=1) as r:
                if r.read() == b"Ok.\n":
                    return proc, http
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("clickhouse-server did not answer /ping")


def query(port: int, sql: str) -> str:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/", data=sql.encode())
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read().decode()


def ustack(*args, src: str = SRC) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ustack", *args], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=src))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def stored_stacks(port: int, db: str) -> int:
    """Distinct stacks a run stored: in stack_frames, or (an older ustack's
    run, OTHER_SRC below) in stacks."""
    try:
        return int(query(port, f"SELECT uniqExact(stack_id) FROM {db}.stack_frames"))
    except urllib.error.HTTPError:               # no such table: an older ustack
        return int(query(port, f"SELECT uniqExact(stack_id) FROM {db}.stacks"))


def host_hour(port: int, url: str, seconds: int, queue: str) -> None:
    with tempfile.TemporaryDirectory() as files:     # the agent without --to first
        before = children_cpu()
        alone = ustack("profile", "-F", "49", "--every", "60", "-d", str(seconds),
                       "-o", f"{files}/")
        alone_cpu = children_cpu() - before
    if alone.returncode != 0:
        raise SystemExit(alone.stderr)
    start, before = time.monotonic(), children_cpu()
    res = ustack("profile", "-F", "49", "--every", "60", "-d", str(seconds), "--to", url,
                 "--host-label", "bench", "--queue", queue)
    wall, with_cpu = time.monotonic() - start, children_cpu() - before
    sent = re.search(r"Sent (\d+) intervals .*, ([\d.]+) s of CPU", res.stderr)
    if res.returncode != 0 or not sent:
        raise SystemExit(res.stderr)
    query(port, "OPTIMIZE TABLE ustack.samples FINAL")
    for table in ("stack_frames", "frames"):
        query(port, f"OPTIMIZE TABLE ustack.{table} FINAL")
    rows, samples = query(port, "SELECT count(), sum(weight) FROM ustack.samples").split()
    stacks = stored_stacks(port, "ustack")
    frames = query(port, "SELECT uniqExact(frame_id) FROM ustack.frames").strip()
    sizes = dict(line.split("\t") for line in query(
        port, "SELECT table, sum(bytes_on_disk) FROM system.parts WHERE "
        "database = 'ustack' AND active GROUP BY table").splitlines())
    scale = 3600 / seconds
    cpu = float(sent.group(2))
    cpus = os.cpu_count() or 1
    print(f"## One host, whole machine, -F 49 --every 60, {seconds} s "
          f"({sent.group(1)} intervals, {samples} samples, wall {wall:.1f} s)\n")
    print("| | measured | per host-hour |")
    print("|---|---:|---:|")
    print(f"| samples rows | {rows} | {int(rows) * scale:,.0f} |")
    print(f"| distinct stacks (stack_frames rows) | {stacks} | (grows slower: stacks repeat) |")
    print(f"| distinct frames (frames rows) | {frames} | (grows slower still) |")
    print(f"| samples bytes on disk | {sizes.get('samples', 0)} | "
          f"{int(sizes.get('samples', 0)) * scale / 1e6:.2f} MB |")
    for table in ("stack_frames", "frames"):
        print(f"| {table} bytes on disk | {sizes.get(table, 0)} | "
              f"at most {int(sizes.get(table, 0)) * scale / 1e6:.2f} MB |")
    print(f"| sending CPU (queue + sender thread) | {cpu:.3f} s | "
          f"{100 * cpu / seconds:.4f} % of one CPU, "
          f"{100 * cpu / seconds / cpus:.4f} % of the machine's {cpus} |")
    for label, spent in (("the whole agent with --to", with_cpu),
                         ("the whole agent without --to (-o DIR/), the run before",
                          alone_cpu)):
        print(f"| {label} | {spent:.3f} s | {100 * spent / seconds / cpus:.3f} % of the "
              "machine |")
    print()


SYNTHETIC = """
INSERT INTO ustack.samples_in SELECT
  toDateTime(1764000000 + intDiv(number, 10000) * 60) AS time,
  toUInt64(time) * 1000000000 AS start_ns, 60000000000 AS duration_ns,
  concat('host', toString(intDiv(number, 200) % 50)) AS host, '' AS container,
  toUInt32(1000 + intDiv(number, 200) % 50) AS pid, toUInt32(0) AS tid,
  concat('svc', toString(number % 7)) AS comm, '/usr/bin/svc' AS executable,
  '' AS build_id, 'profile:hz:49' AS event, toUInt64(1 + number % 13) AS weight,
  toUInt64(number % 200 + 200 * (intDiv(number, 10000) % 25)) AS stack_id,
  concat('synthetic/', toString(intDiv(number, 200))) AS batch
FROM numbers(10000000)
"""
# the stacks as agents send them: frame ids (900 frames, one a function)
SYNTHETIC_FRAMES = """
INSERT INTO ustack.frames SELECT number AS frame_id, concat('function_', toString(number)),
  'libsvc.so', '', 0, 'native', 0
FROM numbers(900)
"""
SYNTHETIC_STACKS = """
INSERT INTO ustack.stack_frames SELECT number AS stack_id,
  arrayMap(i -> toUInt64((number * 7 + i) % 900), range(20)), emptyArrayString()
FROM numbers(5000)
"""


def ten_million(port: int, url: str) -> None:
    sys.path.insert(0, SRC)
    from ustack.report.sinks.clickhouse_schema import create_statements
    for statement in create_statements("ustack"):
        query(port, statement)
    t = time.monotonic()
    query(port, SYNTHETIC)
    query(port, SYNTHETIC_FRAMES)
    query(port, SYNTHETIC_STACKS)
    query(port, "OPTIMIZE TABLE ustack.samples FINAL")
    query(port, "OPTIMIZE TABLE ustack.sums_hourly FINAL")
    query(port, "OPTIMIZE TABLE ustack.sums_daily FINAL")
    built = time.monotonic() - t
    rows = query(port, "SELECT count() FROM ustack.samples WHERE batch LIKE "
                       "'synthetic/%'").strip()
    size = query(port, "SELECT sum(bytes_on_disk) FROM system.parts WHERE database = "
                       "'ustack' AND table = 'samples' AND active").strip()
    hourly, daily = (query(port, f"SELECT countIf(batches = 0), countIf(batches > 0) FROM "
                           f"ustack.{table}").split() for table in ("sums_hourly", "sums_daily"))
    print(f"## Queries over {int(rows):,} synthetic interval rows "
          f"({int(size) / 1e6:.0f} MB on disk, built in {built:.0f} s; "
          f"{int(hourly[0]):,} rows in sums_hourly, {int(daily[0]):,} in sums_daily, "
          f"each with {int(hourly[1]):,} intervals' marker rows)\n")
    print("| query | ustack report wall s (best of 3, start-up included) | ClickHouse's "
          "own s (its queries) | rows read | MB read | lines out |")
    print("|---|---:|---:|---:|---:|---:|")
    from ustack.report.sinks.filters import Filter, parse_time
    hour = ("2025-11-24T16:00:00", "2025-11-24T17:00:00")
    since, until = parse_time(hour[0], ""), parse_time(hour[1], "")
    for label, args, only in (
            ("all 50 hosts, all time: one flame graph", [], Filter()),
            ("one host (--host host7)", ["--host", "host7"], Filter(hosts=("host7",))),
            ("one host, one hour (--since/--until)", ["--host", "host7", "--since", hour[0],
                                                      "--until", hour[1]],
             Filter(hosts=("host7",), since_ns=since, until_ns=until)),
            ("all hosts, one comm (--comm svc3)", ["--comm", "svc3"],
             Filter(comms=("svc3",)))):
        best, out = None, ""
        for _ in range(3):
            t = time.monotonic()
            res = ustack("report", "--from", url, "-f", "folded", *args)
            took = time.monotonic() - t
            if res.returncode != 0:
                raise SystemExit(res.stderr)
            best, out = min(best or took, took), res.stdout
        took, rows, read = server_seconds(port, only)
        print(f"| {label} | {best:.2f} | {took:.2f} | {rows:,} | {read / 1e6:.0f} | "
              f"{len(out.splitlines())} |")
    t = time.monotonic()
    res = ustack("report", "--from", url, "--diff", "host=host1", "host=host2",
                 "-o", "/dev/null")
    print(f"| --diff host=host1 host=host2 (HTML) | {time.monotonic() - t:.2f} | | | | |")
    if res.returncode != 0:
        raise SystemExit(res.stderr)


def server_seconds(port: int, only) -> tuple:
    """What ClickHouse itself took for report --from's queries (its own
    `elapsed`, summed over them; best of 3), and the rows and bytes they
    read: the queries of clickhouse_source.counted_stacks, as it makes them."""
    import json
    from ustack.report.sinks import clickhouse_source
    from ustack.report.sinks.clickhouse_http import Server

    class Timed(Server):
        spent = [0.0, 0, 0]

        def table(self, sql, columns):
            """The same query, in JSON, for ClickHouse's statistics of it."""
            answer = json.loads(self.query(sql + " FORMAT JSONCompact"))
            stats = answer["statistics"]
            self.spent[0] += stats["elapsed"]
            self.spent[1] += stats["rows_read"]
            self.spent[2] += stats["bytes_read"]
            return [[str(v) for v in row] for row in answer["data"]]
    best = None
    for _ in range(3):
        server = Timed(f"clickhouse://127.0.0.1:{port}/ustack")
        server.spent = [0.0, 0, 0]
        clickhouse_source.counted_stacks(server, only)
        best = server.spent if best is None or server.spent[0] < best[0] else best
    return tuple(best)


def sending_pairs(port: int, root: str, seconds: int, pairs: int, other_src) -> None:
    """Alternated runs, printed as a table's rows as they end."""
    print(f"| run | code | output | load | agent CPU s | sending CPU s | new stacks | "
          "us a new stack | sending % of the machine |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    cpus = os.cpu_count() or 1
    for n in range(1, pairs + 1):
        runs = ((("other", other_src, True), ("this", SRC, True)) if other_src else
                (("this", SRC, False), ("this", SRC, True)))
        for label, src, to in runs:
            db = f"pair{n}_{label}"
            load = os.getloadavg()[0]
            with tempfile.TemporaryDirectory() as files:
                where = (["--to", f"clickhouse://127.0.0.1:{port}/{db}", "--host-label",
                          "bench", "--queue", os.path.join(root, db)] if to else
                         ["-o", f"{files}/"])
                before = children_cpu()
                res = ustack("profile", "-F", "49", "--every", "20", "-d", str(seconds),
                             *where, src=src)
                spent = children_cpu() - before
            if res.returncode != 0:
                raise SystemExit(res.stderr)
            if not to:
                print(f"| {n} | {label} | -o DIR/ | {load:.1f} | {spent:.3f} | | | | |",
                      flush=True)
                continue
            sent = re.search(r"Sent (\d+) intervals .*, ([\d.]+) s of CPU", res.stderr)
            if not sent:
                raise SystemExit(res.stderr)
            cpu = float(sent.group(2))
            stacks = stored_stacks(port, db)
            print(f"| {n} | {label} | --to | {load:.1f} | {spent:.3f} | {cpu:.3f} | {stacks} | "
                  f"{1e6 * cpu / max(stacks, 1):.0f} | {100 * cpu / seconds / cpus:.3f} |",
                  flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "sending":
        with tempfile.TemporaryDirectory() as root:
            proc, port = start_server(root)
            try:
                print(f"(ClickHouse {query(port, 'SELECT version()').strip()}, "
                      f"{os.cpu_count()} CPUs)\n")
                sending_pairs(port, root, int(sys.argv[2]), int(sys.argv[3]),
                              sys.argv[4] if len(sys.argv) > 4 else None)
            finally:
                proc.terminate()
                proc.wait()
        return
    seconds = int(sys.argv[1]) if len(sys.argv) > 1 else 120
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as root:
        proc, port = start_server(root)
        url = f"clickhouse://127.0.0.1:{port}/ustack"
        try:
            print(f"(ClickHouse {query(port, 'SELECT version()').strip()}, "
                  f"{os.cpu_count()} CPUs, load average {load:.1f} at the start)\n")
            if seconds:                  # 0: the queries only
                host_hour(port, url, seconds, os.path.join(root, "queue"))
            ten_million(port, url)
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
