"""`ustack top` in a real terminal emulator (tmux, headless): what a person
sees on the screen as they use it. The table names each row's process
(PID and COMMAND), a key sorts it as top(1)'s keys do, the function column
stays on a 40-column terminal, and a window made taller is redrawn whole:
the new table and nothing of the old screen beside it."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest

import helpers
from helpers import build, ustack_env

pytestmark = pytest.mark.kernel

TITLES = re.compile(r"^\s*PID COMMAND\s+%SELF %TOTAL\s+SELF\s+TOTAL  FUNCTION$")
ROW = re.compile(r"^\s*(\d+) (\S+)\s+([\d.]+%|-)\s+([\d.]+%|-)\s+(\d+)\s+(\d+)  (\S+)(?: \[([^\]]+)\])?$")
HINT = "s t f p: sort by self, total, function, pid; q or Ctrl-C: quit"


class Tmux:
    """A tmux server of its own (its socket in the test's directory, gone
    with it), one window running `ustack top ARGS` at a given size."""

    def __init__(self, socket: str):
        self.base = ["tmux", "-S", socket, "-f", "/dev/null"]

    def __call__(self, *args) -> str:
        return subprocess.run([*self.base, *args], check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def start(self, columns: int, lines: int, *args) -> int:
        command = shlex.join([sys.executable, "-m", "ustack", "top", *map(str, args)])
        self("new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(lines),
             "-e", f"PYTHONPATH={ustack_env()['PYTHONPATH']}", f"exec {command}")
        pid = int(self("display-message", "-p", "-t", "top", "#{pane_pid}"))
        helpers.USTACK_PIDS.append(pid)     # the leak check judges what it made
        return pid

    def screen(self) -> list:
        """The window's lines, those left blank below the drawing removed."""
        lines = self("capture-pane", "-p", "-t", "top").split("\n")
        while lines and not lines[-1].strip():
            lines.pop()
        return lines

    def wait_for(self, condition, what: str, timeout: float = 60) -> list:
        """The first screen that satisfies condition (polled: tmux has no
        event to wait on)."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"the screen never showed {what}:\n" + "\n".join(screen))
            time.sleep(0.1)

    def resize(self, columns: int, lines: int) -> None:
        self("resize-window", "-t", "top", "-x", str(columns), "-y", str(lines))

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux(tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (.ci/run installs it)")
    t = Tmux(str(tmp_path / "tmux.socket"))
    yield t
    t.close()


def rows(screen: list) -> list:
    return [m.groups() for m in map(ROW.match, screen) if m]


def table_of(screen: list) -> list:
    """The lines between the titles and the hint, when both are there."""
    titles = [i for i, line in enumerate(screen) if TITLES.match(line)]
    hints = [i for i, line in enumerate(screen) if line == HINT]
    if len(titles) != 1 or len(hints) != 1:
        return []
    return screen[titles[0] + 1:hints[0]]


def test_top_in_a_terminal(tmux):
    busy = build("busy")
    pid = tmux.start(100, 9, "-c", f"{busy} 120")     # a full table: 5 rows
    try:
        # the rows name their process: busy's PID, from the header, and its command
        screen = tmux.wait_for(lambda s: any(r[6] == "spin_here" for r in rows(s)),
                               "busy's spin_here")
        target = int(re.search(r"\(PID (\d+)\)", screen[0]).group(1))
        spin = [r for r in rows(screen) if r[6] == "spin_here"][0]
        assert (int(spin[0]), spin[1], spin[7]) == (target, "busy", "busy"), screen
        assert "sorted by self" in screen[1] and screen[-1] == HINT, screen

        # f sorts by function name (as top(1)'s keys sort its table), at once
        tmux("send-keys", "-t", "top", "f")
        screen = tmux.wait_for(lambda s: "sorted by function" in s[1], "sorted by function")
        names = [r[6] for r in rows(screen)]
        assert len(names) >= 5 and names == sorted(names), screen

        # 40 columns: the function column stays, beside PID and %SELF (sorted
        # by self again: by name, spin_here may sort below the 9 rows' end)
        tmux("send-keys", "-t", "top", "s")
        tmux.wait_for(lambda s: "sorted by self" in s[1], "sorted by self again")
        tmux.resize(40, 9)
        screen = tmux.wait_for(lambda s: any(re.fullmatch(r"\s*\d+\s+[\d.]+%  spin_here \[busy\]", line)
                                             for line in s), "spin_here at 40 columns")
        assert all(len(line) <= 40 for line in screen)
        titles = [line for line in screen if "FUNCTION" in line]
        assert titles and titles[0].split() == ["PID", "%SELF", "FUNCTION"], screen

        # taller and wider again: the whole new table, nothing of the old screen
        tmux.resize(100, 45)
        screen = tmux.wait_for(lambda s: bool(table_of(s)), "the table at 100 columns")
        table = table_of(screen)
        assert all(ROW.match(line) for line in table), screen
        assert len(table) >= 6, screen                     # all busy's functions now
        assert len(rows(screen)) == len(table)
        assert screen[-1] == HINT, screen                  # nothing below the hint
        assert sum(line.startswith("ustack top: ") for line in screen) == 1, screen

        tmux("send-keys", "-t", "top", "q")
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{pid}"), "q did not end ustack top"
    finally:
        tmux.close()
