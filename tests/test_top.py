"""`ustack top`: the live table read from a real pseudo-terminal (the
screen's bytes as a terminal receives them, keys typed into it), and the
plain snapshots it prints when stdout is not a terminal."""
from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import pytest

from helpers import build, finish, popen_ustack, run_ustack, stop

pytestmark = pytest.mark.kernel

FRAMES_PY = Path(__file__).resolve().parent / "programs" / "python" / "frames.py"
ROWS, COLUMNS = 30, 120
TITLES = "    PID COMMAND          %SELF %TOTAL     SELF    TOTAL  FUNCTION"
# a row: PID COMMAND %SELF %TOTAL SELF TOTAL FUNCTION [module] ("-": a
# refresh without samples)
ROW = re.compile(r"^\s*\d+ .{15} \s*([\d.]+%|-)\s+([\d.]+%|-)\s+(\d+)\s+(\d+)  (.+?)(?: \[([^\]]+)\])?$")
ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
FIRST_REFRESHES = 3


class Terminal:
    """A pseudo-terminal of ROWS x COLUMNS whose slave is ustack's
    controlling terminal (stdin and stdout); everything ustack draws is
    kept, and waited on, as it arrives."""

    def __init__(self):
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.modes = termios.tcgetattr(self.slave)
        self.received = bytearray()
        self.changed = threading.Condition()
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:                 # EIO: the slave side is gone
                data = b""
            with self.changed:
                if not data:
                    self.closed = True
                    self.changed.notify_all()
                    return
                self.received.extend(data)
                self.changed.notify_all()

    def start(self, *args) -> subprocess.Popen:
        def controlling_terminal():         # in the child, stdin is the slave
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        return popen_ustack("top", *args, stdin=self.slave, stdout=self.slave,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=controlling_terminal)

    def wait_for(self, condition, timeout: float = 60) -> None:
        """Until condition(screens so far) holds (or ustack's side closes)."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.closed or condition(self.screens()),
                                         timeout):
                pytest.fail(f"the screen never showed what was awaited: {self.screens()[-1:]}")

    def screens(self) -> list:
        """Each whole screen drawn so far: its lines, escapes removed."""
        out = []
        for drawn in bytes(self.received).split(b"\x1b[H")[1:]:
            if b"\x1b[J" not in drawn:
                continue                    # still arriving
            text = ESCAPE.sub(b"", drawn.split(b"\x1b[J")[0]).decode()
            out.append([line.rstrip("\r") for line in text.split("\n")])
        return out

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def close(self) -> None:
        os.close(self.slave)
        self.reader.join(timeout=10)
        os.close(self.master)


def rows(screen: list) -> list:
    """(self %, total %, self, total, function, module) of a screen's rows."""
    found = []
    for line in screen[screen.index(TITLES) + 1:] if TITLES in screen else ():
        m = ROW.match(line)
        if m:
            found.append((percent(m[1]), percent(m[2]), int(m[3]), int(m[4]), m[5], m[6]))
    return found


def percent(text: str) -> float:
    return 0.0 if text == "-" else float(text.rstrip("%"))


def refreshed(screens: list) -> list:
    """The screens drawn after a refresh that counted samples."""
    return [s for s in screens if len(s) > 1 and not s[1].startswith("samples 0 ")]


def busy_is_hot(screen: list) -> bool:
    table = rows(screen)
    main = [r for r in table if r[4:] == ("main", "busy")]
    return (bool(table) and table[0][4:] == ("spin_here", "busy") and table[0][0] >= 80
            and bool(main) and main[0][1] >= 90)


@pytest.fixture
def terminal():
    t = Terminal()
    yield t
    t.close()


@pytest.mark.parametrize("backend, key", [("bpf", b"q"), ("perf", b"\x03")])
def test_busy_on_a_terminal_then_a_key_ends_it(terminal, backend, key):
    """q, or Ctrl-C (a signal to the terminal's foreground: ustack and its
    command), ends the run with status 0 and the terminal as it was."""
    busy = build("busy")
    run = terminal.start("-c", f"{busy} 60", "--backend", backend)
    try:
        terminal.wait_for(lambda s: len(refreshed(s)) >= FIRST_REFRESHES)
        first = refreshed(terminal.screens())[:FIRST_REFRESHES]
        assert any(busy_is_hot(s) for s in first), first
        screen = first[-1]
        assert re.fullmatch(rf"ustack top: '{re.escape(str(busy))} 60' \(PID \d+\)",
                            screen[0]), screen[0]
        assert re.fullmatch(rf"samples \d+ \(total \d+\), lost \d+; backend {backend}; "
                            r"\d+ s; sorted by self", screen[1]), screen[1]
        assert len(screen) <= ROWS and all(len(line) <= COLUMNS for line in screen)
        terminal.type(key)
        _out, err = finish(run, 30)
    finally:
        stop(run)
    assert run.returncode == 0, err
    assert termios.tcgetattr(terminal.slave) == terminal.modes
    tail = bytes(terminal.received)[-32:]
    assert tail.endswith(b"\x1b[?25h\x1b[?1049l"), tail       # cursor and screen back
    assert "was ended with the run" in err and "Traceback" not in err, err


def start_python(mode: str = "busy") -> tuple:
    """frames.py MODE working until its stdin closes, and its facts."""
    proc = subprocess.Popen([sys.executable, str(FRAMES_PY), mode, "stdin"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, json.loads(proc.stdout.readline())


def test_a_python_program_shows_its_python_leaf_on_top_then_ctrl_c(terminal):
    proc, facts = start_python()
    run = None
    try:
        run = terminal.start("-p", str(facts["pid"]))
        terminal.wait_for(lambda s: len(refreshed(s)) >= FIRST_REFRESHES)
        first = refreshed(terminal.screens())[:FIRST_REFRESHES]
        tops = [rows(s)[0][4:] for s in first]
        assert ("spin (frames.py)", "python") in tops, first
        terminal.type(b"\x03")              # Ctrl-C, through the terminal
        _out, err = finish(run, 30)
    finally:
        if run is not None:
            stop(run)
        proc.stdin.close()
        stop(proc)
    assert run.returncode == 0, err
    assert termios.tcgetattr(terminal.slave) == terminal.modes
    assert bytes(terminal.received).endswith(b"\x1b[?25h\x1b[?1049l")
    assert "Traceback" not in err, err


def test_snapshots_when_stdout_is_not_a_terminal():
    busy = build("busy")
    res = run_ustack("top", "-c", f"{busy} 3", timeout=60)
    assert res.returncode == 0, res.stderr
    snapshots = res.stdout.split("\n\n")
    assert snapshots[-1] == "" and len(snapshots) >= 3, res.stdout
    for text in snapshots[:-1]:
        lines = text.split("\n")
        assert re.fullmatch(rf"ustack top: '{re.escape(str(busy))} 3' \(PID \d+\)",
                            lines[0]), lines
        assert re.fullmatch(r"samples \d+ \(total \d+\), lost \d+; backend bpf; "
                            r"\d+ s; sorted by self", lines[1]), lines
        assert lines[2] == TITLES
        assert all(ROW.match(line) for line in lines[3:]), lines
        assert len(rows(lines)) == len(lines) - 3
    assert busy_is_hot(snapshots[0].split("\n")), snapshots[0]
    totals = [int(re.search(r"\(total (\d+)\)", s).group(1)) for s in snapshots[:-1]]
    assert totals == sorted(totals) and totals[-1] > totals[0]


def python_snapshots(*args) -> list:
    """The tables of `ustack top -d 2 ARGS -p` a frames.py `sorted`: leaf
    calls the builtin sorted(), which calls key_of, which calls spin."""
    proc, facts = start_python("sorted")
    try:
        res = run_ustack("top", "-d", "2", *args, "-p", str(facts["pid"]), timeout=60)
    finally:
        proc.stdin.close()
        stop(proc)
    assert res.returncode == 0, res.stderr
    return [rows(text.split("\n")) for text in res.stdout.split("\n\n")[:-1]]


def test_sort_and_rows():
    """--sort total ranks main (around every sample) above spin (in most),
    --sort self the other way round (main has no samples of its own);
    -n keeps that many rows."""
    by_self = python_snapshots("-n", "30")
    by_total = python_snapshots("--sort", "total", "-n", "30")
    main, spin = "main (frames.py)", "spin (frames.py)"
    for table in by_self[:2]:
        names = [r[4] for r in table]
        assert names[0] == spin and names.index(spin) < names.index(main), table
        assert [r[0] for r in table] == sorted((r[0] for r in table), reverse=True)
    for table in by_total[:2]:
        names = [r[4] for r in table]
        assert names.index(main) < names.index(spin), table
        assert [r[1] for r in table] == sorted((r[1] for r in table), reverse=True)
    assert [len(t) for t in python_snapshots("-n", "3")[:2]] == [3, 3]


@pytest.mark.parametrize("args, message", [
    (("-p", "999999999"), "ustack: no such process: 999999999"),
    (("-F", "0"), "ustack: -F must be a positive frequency"),
    (("-n", "0"), "ustack: --rows must be a positive number"),
    (("--sort", "name"), "ustack: argument --sort: invalid choice: 'name' "
                         "(choose from 'self', 'total', 'function', 'pid') "
                         "(see `ustack top --help`)"),
])
def test_bad_input_is_one_line(args, message):
    res = run_ustack("top", *args, timeout=60)
    assert res.returncode == 1
    assert res.stderr == message + "\n"
    assert res.stdout == ""


def test_q_typed_before_the_first_screen_ends_the_run(terminal):
    """q heard while the run is still being set up (typed before ustack
    started): it ends then, unstarted or at once, its command ended and
    the terminal's modes restored."""
    busy = build("busy")
    terminal.type(b"q")
    run = terminal.start("-c", f"{busy} 60")
    try:
        _out, err = finish(run, 30)
    finally:
        stop(run)
    if run.returncode == 130:               # heard before the probes were live
        assert err.splitlines()[-1] == "ustack: interrupted while setting up: nothing was traced"
    else:                                   # or as the run began
        assert run.returncode == 0 and "was ended with the run" in err, err
    assert termios.tcgetattr(terminal.slave) == terminal.modes


def test_the_last_table_stays_when_the_command_ends(terminal):
    """A run that ends on its own (here its command exits) leaves its last
    table on the terminal's own screen, plain lines."""
    busy = build("busy")
    run = terminal.start("-c", f"{busy} 2", "-n", "3")
    try:
        _out, err = finish(run, 60)
    finally:
        stop(run)
    assert run.returncode == 0, err

    def left():
        """The lines written after the screen was left."""
        received = bytes(terminal.received)
        if b"\x1b[?1049l" not in received:
            return []
        return received.split(b"\x1b[?1049l")[-1].decode().split("\r\n")

    terminal.wait_for(lambda _s: len(left()) == 2 + 1 + 3 + 1)    # and the last \r\n
    lines = left()[:-1]
    after = "".join(lines)
    assert re.fullmatch(rf"ustack top: '{re.escape(str(busy))} 2' \(PID \d+\)", lines[0])
    assert lines[2] == TITLES and "\x1b" not in after
    assert rows(lines)[0][4:] == ("spin_here", "busy") and len(rows(lines)) == 3
    assert termios.tcgetattr(terminal.slave) == terminal.modes
