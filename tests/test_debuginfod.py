"""Debug files of stripped programs fetched from debuginfod servers: Debian's
own server (`debuginfod -F DIR`) serves the debug file split off a test
program, and a stripped copy traced, counted, profiled and recorded then
shows the functions, inlined calls and lines the unstripped program shows.
A server that never answers leaves the run as fast as without one, its
objects said to be unnamed; one that answers with another build's debug
file is refused and the next server asked.

The runs attach (-p) to a program waiting on stdin: it is released once the
debug file is in the run's cache (the run asks for it when it first reads
the program's mappings), so no test races the fetch."""
import http.server
import os
import re
import shutil
import socket
import subprocess
import threading
import urllib.request

import pytest

from helpers import (O2_FP, FakeMaps, build, finish, nm_symbols, parse_counts,
                     popen_ustack, release, run_ustack, spawn, stop, text_mapping,
                     unnamed, ustack_env, wait_tracing, wait_until)

from ustack.model import SymbolOptions
from ustack.symbols.symbolizer import Symbolizer


CALLS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build_id(path) -> str:
    out = subprocess.run(["readelf", "-n", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return re.search(r"Build ID: ([0-9a-f]+)", out).group(1)


def _answer(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except OSError as e:
        return getattr(e, "code", 0)


def _untagged_env() -> dict:
    """The environment of a server shared by the module's tests: not one
    test's process (the leak check judges a test's own)."""
    return {k: v for k, v in os.environ.items() if k != "USTACK_TEST_TAG"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(unstripped program, stripped copy, its build-id, URL of a debuginfod
    server holding its debug file)."""
    for tool in ("debuginfod", "objcopy", "readelf"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    tmp = tmp_path_factory.mktemp("debuginfod")
    full = build("served", flags=O2_FP)
    (tmp / "full").mkdir()
    (tmp / "stripped").mkdir()
    (tmp / "served").mkdir()
    unstripped = tmp / "full" / "served"
    shutil.copy(full, unstripped)
    stripped = tmp / "stripped" / "served"
    subprocess.run(["objcopy", "--strip-all", str(full), str(stripped)], check=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(full),
                    str(tmp / "served" / "served.debug")], check=True)
    build_id = _build_id(full)
    port = _free_port()
    server = subprocess.Popen(
        ["debuginfod", "-p", str(port), "-F", str(tmp / "served"),
         "-d", str(tmp / "index.sqlite")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_untagged_env())
    url = f"http://127.0.0.1:{port}"
    try:
        # answers 404 until its scan indexed the file: wait for the 200
        wait_until(lambda: _answer(f"{url}/buildid/{build_id}/debuginfo") == 200,
                   timeout=60, what="debuginfod serving the debug file")
        yield unstripped, stripped, build_id, url
    finally:
        server.terminate()
        server.wait()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    monkeypatch.setenv("USTACK_CACHE_DIR", str(directory))
    monkeypatch.delenv("DEBUGINFOD_URLS", raising=False)
    return directory


def _fetched(cache, build_id):
    return cache / "debuginfod" / f"{build_id}.debug"


def _run(program, *args, urls=(), wait_for=None, spin=0):
    """ustack ARGS -p a fresh `program` (waiting on stdin), with
    DEBUGINFOD_URLS=urls; the target is released once ustack traces and
    `wait_for` (a path) exists. (stdout, stderr)."""
    target = spawn(program, CALLS, "-", spin, stdin=subprocess.PIPE)
    env = ustack_env()
    if urls:
        env["DEBUGINFOD_URLS"] = " ".join(urls)
    us = popen_ustack(*args, "-p", target.pid, env=env, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    try:
        header = wait_tracing(us)
        if wait_for is not None:
            wait_until(wait_for.exists, timeout=30, what=f"{wait_for} fetched")
        release(target)
        out, err = finish(us)
    finally:
        stop(us)
        stop(target)
    assert us.returncode == 0, err
    return out, header + err


def _frames(trace_out: str) -> list:
    """Each event's frames as printed, without the addresses (the two
    copies load at other places)."""
    stacks, cur = [], None
    for line in trace_out.splitlines():
        if not line:
            cur = None
        elif cur is None:
            cur = []
            stacks.append(cur)
        else:
            cur.append(line.split(" : ", 1)[1])
    return stacks


def _sink(unstripped) -> str:
    out = subprocess.run(["nm", str(unstripped)], capture_output=True, text=True,
                         check=True).stdout
    return "0x" + next(l.split()[0] for l in out.splitlines() if l.endswith(" T sink"))


def _counts(out: str) -> list:
    return sorted((tuple(s["frames"]), s["count"]) for s in parse_counts(out))


def test_late_file_names_frames_named_before(served, cache):
    """A frame met before its debug file arrived is named once it has:
    the memo of "no debug file" does not outlive the arrival."""
    unstripped, stripped, build_id, url = served
    base = 0x555555554000
    maps = FakeMaps({1: [text_mapping(str(stripped), base)]})
    sink = base + nm_symbols(unstripped)["sink"][0] + 1
    sym = Symbolizer(maps, SymbolOptions(debuginfod=(url,)))
    assert sym.frames_at(1, sink)[0].function is None
    wait_until(sym.debug_arrived, timeout=30, what="the debug file's arrival")
    assert sym.frames_at(1, sink)[0].function == "sink"
    assert _fetched(cache, build_id).exists()


@pytest.mark.kernel
@pytest.mark.parametrize("command", ["trace", "count"])
def test_stripped_named_like_unstripped(served, cache, command):
    unstripped, stripped, build_id, url = served
    spec = f"uprobe:{{}}:{_sink(unstripped)}"
    args = (command, "--inlines", "--lines")
    want, _ = _run(unstripped, *args, spec.format(unstripped))
    got, err = _run(stripped, *args, spec.format(stripped), urls=[url],
                    wait_for=_fetched(cache, build_id))
    if command == "trace":
        assert _frames(got) == _frames(want) and len(_frames(want)) == 2 * CALLS
        assert any("[inlined]" in f or "inlined" in f for f in _frames(got)[0]), got
    else:
        assert _counts(got) == _counts(want)
    assert "sink" in got and "outer" in got and "served.c:" in got
    assert not [line for line in err.splitlines() if line.startswith("ustack:")], err


def _spin_stacks(out: str) -> set:
    """The program's frames of each sampled stack whose leaf is spin."""
    return {tuple(f for f, m in s["frames"] if m == "served") for s in parse_counts(out)
            if s["frames"] and s["frames"][0] == ("spin", "served")}


@pytest.mark.kernel
def test_profile_names_stripped_program(served, cache):
    unstripped, stripped, build_id, url = served
    want, _ = _run(unstripped, "profile", "-F", "999", spin=200)
    # the server named by the option, not the environment
    got, err = _run(stripped, "profile", "-F", "999", "--debuginfod", url,
                    wait_for=_fetched(cache, build_id), spin=200)
    assert _spin_stacks(got) == _spin_stacks(want) and _spin_stacks(want), got
    functions = set(nm_symbols(unstripped))
    # (a sample in a PLT stub is unnamed in both: no symbol covers it)
    names = {f for s in parse_counts(got) for f, m in s["frames"]
             if m == "served" and not unnamed(f)}
    assert names <= functions, names - functions


@pytest.mark.kernel
def test_record_then_report_names(served, cache, tmp_path):
    unstripped, stripped, build_id, url = served
    spec = f"uprobe:{{}}:{_sink(unstripped)}"
    rec = tmp_path / "run.ustack"
    _run(stripped, "record", spec.format(stripped), "-o", rec, urls=[url],
         wait_for=_fetched(cache, build_id))
    want_rec = tmp_path / "want.ustack"
    _run(unstripped, "record", spec.format(unstripped), "-o", want_rec)
    got = run_ustack("report", rec, "--inlines", "--lines")
    want = run_ustack("report", want_rec, "--inlines", "--lines")
    assert got.returncode == 0, got.stderr
    assert _frames(got.stdout) == _frames(want.stdout) and "sink" in got.stdout


@pytest.mark.kernel
def test_archive_carries_fetched_debug_file(served, cache, tmp_path, monkeypatch):
    unstripped, stripped, build_id, url = served
    rec = tmp_path / "run.ustack"
    _run(stripped, "record", f"uprobe:{stripped}:{_sink(unstripped)}", "-o", rec,
         urls=[url], wait_for=_fetched(cache, build_id))
    archived = run_ustack("archive", rec)
    assert archived.returncode == 0, archived.stderr
    debug = tmp_path / "run.ustack.objects" / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    assert debug.read_bytes() == _fetched(cache, build_id).read_bytes()
    # elsewhere: no cache, no server; the archive names the frames
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "empty-cache"))
    got = run_ustack("report", rec, "--debug-dir", tmp_path / "run.ustack.objects")
    assert got.returncode == 0, got.stderr
    assert "sink+" in got.stdout and "outer+" in got.stdout, got.stdout


@pytest.fixture
def silent_server():
    """A server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held = []
    done = threading.Event()

    def accept():
        while not done.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    done.set()
    sock.close()
    for c in held:
        c.close()


@pytest.mark.kernel
def test_silent_server_leaves_objects_unnamed(served, cache, silent_server):
    unstripped, stripped, build_id, _url = served
    out, err = _run(stripped, "count", f"uprobe:{stripped}:{_sink(unstripped)}",
                    urls=[silent_server])
    frames = [f for s in parse_counts(out) for f in s["frames"] if f[1] == "served"]
    assert frames and all(unnamed(f) for f, _ in frames), out
    note = [l for l in err.splitlines() if l.startswith("ustack: debuginfod")]
    assert note == [f"ustack: debuginfod: the debug files of {stripped} had not arrived "
                    "when their frames were named: those are not named (a later "
                    "`ustack report` of a recording names them)"], err
    assert not _fetched(cache, build_id).exists()


@pytest.fixture(params=["another build", "not ELF"])
def wrong_server(tmp_path, request):
    """A server answering every request with another build's debug file,
    or with bytes that are no ELF file. (URL, what the refusal says of it)."""
    if request.param == "not ELF":
        body, what = b"<html>no such file</html>\n" * 100, "is no ELF file"
    else:
        other = build("served", flags=("-O0", "-g"))
        wrong = tmp_path / "other.debug"
        subprocess.run(["objcopy", "--only-keep-debug", str(other), str(wrong)], check=True)
        body, what = wrong.read_bytes(), f"has build-id {_build_id(other)}"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", what
    server.shutdown()
    server.server_close()


@pytest.mark.kernel
def test_wrong_file_refused_then_next_server(served, cache, wrong_server):
    unstripped, stripped, build_id, url = served
    wrong_url, what = wrong_server
    spec = f"uprobe:{{}}:{_sink(unstripped)}"
    want, _ = _run(unstripped, "trace", spec.format(unstripped))
    got, err = _run(stripped, "trace", spec.format(stripped), urls=[wrong_url, url],
                    wait_for=_fetched(cache, build_id))
    assert _frames(got) == _frames(want)
    note = [l for l in err.splitlines() if l.startswith("ustack: debuginfod")]
    assert note == [f"ustack: debuginfod {wrong_url}: the file sent as the debug file of "
                    f"{stripped} (build-id {build_id}) {what}; refused and deleted"], err


def _unserved(tmp_path, flags) -> str:
    """A stripped build of the served program the server has no debug file of."""
    out = tmp_path / f"unserved{len(flags)}" / "served"
    out.parent.mkdir()
    subprocess.run(["objcopy", "--strip-all", str(build("served", flags=flags)), str(out)],
                   check=True)
    return str(out)


def _said(sym, start: str) -> list:
    return [n for n in sym.warnings if n.startswith(start)]


def _named_at_main(sym, prog, pid=1) -> None:
    """Name a frame in `prog` (mapped in `pid`): the run asks for its file."""
    assert sym.frames_at(pid, 0x555555554000 + 0x1001)[0].function is None


def test_no_server_has_the_file_said(served, cache, tmp_path):
    """A 404 from every server: one line names the object, not "still coming"."""
    _unstripped, _stripped, _build_id, url = served
    prog = _unserved(tmp_path, ("-O0", "-g"))
    sym = Symbolizer(FakeMaps({1: [text_mapping(prog, 0x555555554000)]}),
                     SymbolOptions(debuginfod=(url,), debug_dirs=(str(tmp_path),)))
    _named_at_main(sym, prog)
    wait_until(lambda: _said(sym, "debuginfod: no server"), timeout=30,
               what="the server's 404")
    assert _said(sym, "debuginfod") == [
        f"debuginfod: no server has the debug file of {prog} (404): their frames "
        "stay unnamed"]


def test_server_down_said_once(cache, tmp_path):
    prog = _unserved(tmp_path, ("-O0", "-g"))
    down = f"http://127.0.0.1:{_free_port()}"        # nothing listens there
    sym = Symbolizer(FakeMaps({1: [text_mapping(prog, 0x555555554000)]}),
                     SymbolOptions(debuginfod=(down,), debug_dirs=(str(tmp_path),)))
    _named_at_main(sym, prog)
    wait_until(lambda: _said(sym, f"debuginfod {down}"), timeout=30,
               what="the refused connection")
    assert _said(sym, "debuginfod") == [f"debuginfod {down}: Connection refused"]


def test_fetches_bounded(served, cache, tmp_path, monkeypatch):
    """Past the run's bound no object is asked for, and the run says which."""
    from ustack.objfile import debuginfod
    monkeypatch.setattr(debuginfod, "MAX_FETCHES", 1)
    _unstripped, _stripped, _build_id, url = served
    first, second = _unserved(tmp_path, ("-O0", "-g")), _unserved(tmp_path, ("-O1",))
    sym = Symbolizer(FakeMaps({1: [text_mapping(first, 0x555555554000)],
                               2: [text_mapping(second, 0x555555554000)]}),
                     SymbolOptions(debuginfod=(url,), debug_dirs=(str(tmp_path),)))
    _named_at_main(sym, first, 1)
    _named_at_main(sym, second, 2)
    wait_until(lambda: _said(sym, "debuginfod: 1 debug files"), timeout=30,
               what="the second object refused by the bound")
    wait_until(lambda: _said(sym, "debuginfod: no server"), timeout=30,
               what="the server's 404 for the first object")
    assert _said(sym, "debuginfod") == [
        f"debuginfod: no server has the debug file of {first} (404): their frames "
        "stay unnamed",
        f"debuginfod: 1 debug files asked for, the most a run asks; not asked: {second}"]


@pytest.mark.kernel
def test_report_names_what_the_record_run_could_not(served, cache, silent_server, tmp_path):
    """A recording made while the server never answered is named by a
    later report once a server has the file."""
    unstripped, stripped, build_id, url = served
    spec = f"uprobe:{{}}:{_sink(unstripped)}"
    rec = tmp_path / "run.ustack"
    _out, err = _run(stripped, "record", spec.format(stripped), "-o", rec,
                     urls=[silent_server])
    assert not _fetched(cache, build_id).exists(), err
    want_rec = tmp_path / "want.ustack"
    _run(unstripped, "record", spec.format(unstripped), "-o", want_rec)
    got = run_ustack("report", rec, "--inlines", "--lines",
                     env=dict(ustack_env(), DEBUGINFOD_URLS=url))
    want = run_ustack("report", want_rec, "--inlines", "--lines")
    assert got.returncode == 0, got.stderr
    assert _frames(got.stdout) == _frames(want.stdout) and "sink" in got.stdout, got.stderr
