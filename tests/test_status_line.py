"""The live status line as a person sees it: ustack in a real terminal
(tmux), stdout and stderr both on it. The line is redrawn in place while
the run counts and must be gone before the results are printed: none of
them may be printed onto it."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

import pytest

from helpers import O2_FP, build, ustack_env, wait_until

pytestmark = pytest.mark.kernel

DONE = "== ustack returned"


@pytest.fixture
def terminal(tmp_path):
    """Run a shell command line in a new 200x50 tmux terminal; returns a
    function that runs it and gives the screen's lines once it is done."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed: the status line needs a real terminal")
    socket = f"ustack-test-{tmp_path.name}"

    def run(line: str, until: str = DONE) -> list:
        script = tmp_path / "run.sh"
        env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in ustack_env().items()
                      if k.isidentifier())
        script.write_text(f"{env}{line}\necho '{DONE}' $?\nexec sleep 600\n")
        subprocess.run(["tmux", "-L", socket, "new-session", "-d", "-x", "200", "-y", "50",
                        "bash", str(script)], check=True)

        def screen() -> list:
            return subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-J"],
                                  capture_output=True, text=True, check=True
                                  ).stdout.splitlines()
        wait_until(lambda: any(until in row for row in screen()), timeout=60,
                   what=f"{until!r} on the terminal")
        return [row.rstrip() for row in screen()]

    try:
        yield run
    finally:
        # end a run still going as a person would (Ctrl-C), so it cleans up
        subprocess.run(["tmux", "-L", socket, "send-keys", "C-c"], capture_output=True)
        shown = subprocess.run(["tmux", "-L", socket, "capture-pane", "-p", "-J"],
                               capture_output=True, text=True).stdout
        if shown and DONE not in shown:
            wait_until(lambda: DONE in subprocess.run(
                ["tmux", "-L", socket, "capture-pane", "-p", "-J"],
                capture_output=True, text=True).stdout, timeout=30, what="ustack's end")
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_results_are_not_printed_onto_the_status_line(terminal, backend):
    chain = build("chain", flags=O2_FP)
    rows = terminal(f"{shlex.quote(sys.executable)} -m ustack count --backend {backend} "
                    f"uprobe:{chain}:d -c '{chain} 3'")
    assert not any("[ustack]" in row for row in rows), rows
    header = next(i for i, row in enumerate(rows) if row.startswith("Tracing "))
    after = rows[header + 1:rows.index(next(r for r in rows if DONE in r))]
    # the counted stack's lines (indented), before the run's closing notes
    # ("Unwind rows of 1 objects were loaded during the run, ...")
    counted = after[:next((i for i, r in enumerate(after) if r and not r.startswith(" ")),
                          len(after))]
    assert counted[0] == "  d [chain]", rows
    assert [r.strip() for r in counted if r.strip()][-1] == "3", rows


def test_trace_to_a_file_counts_its_events_on_the_status_line(terminal, tmp_path):
    """A trace's stacks reach ustack one by one, unwound in the kernel or
    not: its status line counts them (it counts nothing in the kernel)."""
    rows = terminal(f"{shlex.quote(sys.executable)} -m ustack trace --backend bpf "
                    f"syscall:nanosleep -o {tmp_path}/t.txt -d 30 -c 'sleep 20'",
                    until="[ustack]")
    (status,) = [row for row in rows if "[ustack]" in row]
    assert "counting in the kernel" not in status and " events, " in status, status
