"""Where results go: `-o FILE` keeps a traced command's own output
on the terminal and ustack's results in the file, in the format its name
implies unless -f says otherwise; the live status line on a terminal; a run
that saw no events says so."""
from __future__ import annotations

import os
import pty
import subprocess
import threading

import pytest

from helpers import FP, build, popen_ustack, run_ustack

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def ok(res):
    assert res.returncode == 0, res.stderr
    return res


def shell_around(chain, n: int) -> str:
    """A command that prints before and after running chain (d called n times)."""
    return f"sh -c 'echo before; {chain} {n}; echo after'"


def test_count_to_a_file_keeps_the_commands_output_apart(chain, tmp_path):
    out = tmp_path / "stacks.folded"
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", shell_around(chain, 7),
                        "-o", out))
    assert res.stdout == "before\nafter\n"           # the command's, nothing of ours
    lines = out.read_text().splitlines()              # folded, by the file's name
    assert len(lines) == 1 and lines[0].endswith(";main;a;b;c;d 7"), lines
    assert not [p for p in tmp_path.iterdir() if p != out]   # no temporary left


def test_format_option_wins_over_the_files_name(chain, tmp_path):
    out = tmp_path / "stacks.folded"
    ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 3", "-f", "text",
                  "-o", out))
    text = out.read_text()
    assert "  d [chain]\n" in text and "\n    3\n" in text, text


def test_trace_to_a_file(chain, tmp_path):
    out = tmp_path / "events.txt"
    res = ok(run_ustack("trace", f"uprobe:{chain}:d", "-c", shell_around(chain, 4),
                        "-o", out))
    assert res.stdout == "before\nafter\n"
    text = out.read_text()
    assert text.count(f": uprobe:{chain}:d\n") == 4, text
    assert text.count(" : d+0x0/") == 4


def test_output_into_a_missing_directory_is_refused_before_the_run(chain, tmp_path):
    res = run_ustack("count", f"uprobe:{chain}:d", "-c", shell_around(chain, 1),
                     "-o", tmp_path / "no" / "such.folded")
    assert res.returncode == 1
    assert res.stderr.strip() == (f"ustack: -o {tmp_path}/no/such.folded: "
                                  f"no such directory {tmp_path}/no")
    assert res.stdout == ""                           # the command never ran


def test_a_format_the_command_does_not_have_is_refused(chain):
    res = run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 1", "-f", "folded")
    assert res.returncode == 1
    assert "invalid choice: 'folded'" in res.stderr and res.stderr.count("\n") == 1


def test_a_run_without_events_says_so(chain):
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 0"))
    assert res.stdout == ""
    assert "no events were seen" in res.stderr


def _stderr_through_a_terminal(*args) -> tuple:
    """Run ustack with stderr on a pseudo-terminal, as a person at a shell
    has it; returns (exit status, what the terminal received)."""
    master, slave = pty.openpty()
    received = bytearray()

    def read_all():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:                   # EIO: every writer has closed
                return
            if not data:
                return
            received.extend(data)

    reader = threading.Thread(target=read_all)
    reader.start()
    proc = popen_ustack(*args, stdout=open(os.devnull, "w"), stderr=slave)
    os.close(slave)
    status = proc.wait(timeout=60)
    reader.join(timeout=10)
    os.close(master)
    return status, received.decode(errors="replace")


@pytest.mark.parametrize("backend, shown", [("perf", " events, "),
                                            ("bpf", "counting in the kernel")])
def test_a_terminal_shows_a_status_line_that_is_cleared_at_the_end(chain, backend, shown):
    status, screen = _stderr_through_a_terminal(
        "count", f"uprobe:{chain}:d", "-c", f"{chain} 5", "--backend", backend)
    assert status == 0, screen
    assert "[ustack] " in screen and shown in screen, screen
    last_status = screen.rindex("[ustack] ")
    assert "\r\x1b[K" in screen[last_status:], "the status line is cleared"


def test_no_status_line_when_stderr_is_not_a_terminal(chain):
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 5"))
    assert "[ustack]" not in res.stderr and "\x1b" not in res.stderr


def test_a_file_name_of_another_commands_format_is_refused(chain, tmp_path):
    res = run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 1",
                     "-o", tmp_path / "x.speedscope.json")
    assert res.returncode == 1
    assert res.stderr == (f"ustack: -o {tmp_path}/x.speedscope.json: speedscope is "
                          "not a format of this command (one of text, perf-script, "
                          "json; or say which with -f)\n")
    assert not list(tmp_path.iterdir())


def test_pprof_by_the_files_name(chain, tmp_path):
    out = tmp_path / "run.pb.gz"
    ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 3", "-o", out))
    from helpers import top                # go tool pprof -top
    assert top(out)["d"] == ("3", "3")


ALL_ENDINGS = ".txt, .log, .folded, .html, .htm, .svg, .pb.gz, .pprof, .speedscope.json, .json"


@pytest.mark.parametrize("name", ["out.png", "run.data"])
def test_a_name_whose_ending_ustack_does_not_write_is_refused_before_the_run(
        chain, tmp_path, name):
    res = run_ustack("profile", "-d", "1", "-c", shell_around(chain, 1), "-o", tmp_path / name)
    assert (res.returncode, res.stdout) == (1, "")      # the command never ran
    ending = "." + name.rpartition(".")[2]
    assert res.stderr == (f"ustack: -o {tmp_path}/{name}: ustack writes no {ending} file "
                          f"here; end the name with {ALL_ENDINGS}, or say which with -f "
                          "(text, folded, html, svg, pprof, speedscope, json)\n")
    assert list(tmp_path.iterdir()) == []


def test_the_header_names_what_is_written_where(chain, tmp_path):
    for name, fmt in (("flame.html", "html"), ("stacks", "text"), ("run.log", "text")):
        res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 2",
                            "-o", tmp_path / name))
        assert res.stderr.splitlines()[0].endswith(
            f"], writing {fmt} to {tmp_path}/{name}... Hit Ctrl-C to end."), res.stderr
    assert (tmp_path / "flame.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("name", ["x.pb.gz", "x.folded"])
def test_every_into_a_files_name_is_refused(chain, tmp_path, name):
    res = run_ustack("profile", "--every", "1", "-d", "1", "-c", shell_around(chain, 1),
                     "-o", tmp_path / name)
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"ustack: -o {tmp_path}/{name} names a file: --every writes a "
                          "pprof file per interval into a directory (-o DIR/)\n")
    assert list(tmp_path.iterdir()) == []


def test_latency_and_dump_refuse_an_ending_they_do_not_write(chain, tmp_path):
    res = run_ustack("latency", "syscall:write", "-c", shell_around(chain, 1),
                     "-o", tmp_path / "lat.png")
    assert (res.returncode, res.stdout) == (1, "")
    assert res.stderr == (f"ustack: -o {tmp_path}/lat.png: ustack writes no .png file "
                          "here; it writes text: end the name with .txt, .log, or give "
                          "it no ending\n")
    res = run_ustack("dump", "-p", os.getpid(), "-o", tmp_path / "dump.png")
    assert res.returncode == 1 and res.stderr.startswith(
        f"ustack: -o {tmp_path}/dump.png: ustack writes no .png file here")
    assert list(tmp_path.iterdir()) == []


def test_trace_to_a_file_replaces_it_when_the_run_ends(chain, tmp_path):
    """trace -o writes a hidden new file while it runs: the file named keeps
    its old bytes until the run ends (it was truncated at the start and
    written in place, into whatever file was at the name)."""
    from helpers import finish, stop, wait_tracing
    out = tmp_path / "events.txt"
    out.write_text("the last run's events\n")
    us = popen_ustack("trace", f"uprobe:{chain}:d", "-c", f"sh -c 'read go; {chain} 3'",
                      "-o", out, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)
    try:
        wait_tracing(us)                          # the probes are armed
        assert out.read_text() == "the last run's events\n"
        hidden = [p.name for p in tmp_path.iterdir() if p != out]
        assert len(hidden) == 1 and hidden[0].startswith(".events.txt."), hidden
        us.stdin.write("go\n")
        us.stdin.flush()
        _out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    assert out.read_text().count(f": uprobe:{chain}:d\n") == 3
    assert [p.name for p in tmp_path.iterdir()] == ["events.txt"]
