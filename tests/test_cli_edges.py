"""Command-line behaviour users found surprising, each as a
user meets it: exit statuses, quoting, ambiguous input, abbreviations."""
from __future__ import annotations

import pytest

from helpers import FP, build, run_ustack


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def one_line_error(res, text: str) -> None:
    assert res.returncode == 1, res.stderr
    assert res.stderr == f"ustack: {text}\n"
    assert res.stdout == ""


@pytest.mark.kernel
def test_a_failing_command_gives_ustack_its_exit_status_and_a_quoted_header():
    res = run_ustack("count", "syscall:exit_group", "-c", "sh -c 'exit 3'")
    assert res.returncode == 3, res.stderr
    assert "in \"sh -c 'exit 3'\" (PID " in res.stderr
    assert "sh exited with status 3" in res.stderr


@pytest.mark.kernel
def test_a_command_killed_by_a_signal_says_which():
    res = run_ustack("count", "syscall:exit_group", "-c", "sh -c 'kill -SEGV $$'")
    assert "sh was killed by SIGSEGV" in res.stderr.splitlines(), res.stderr
    assert "status -11" not in res.stderr


@pytest.mark.kernel
def test_a_command_ended_by_the_duration_is_not_a_failure():
    res = run_ustack("count", "syscall:clock_nanosleep", "-d", "1", "-c", "sleep 30")
    assert res.returncode == 0, res.stderr
    assert "exited with status" not in res.stderr
    assert res.stderr.splitlines()[-1].startswith("sleep (PID ")
    assert res.stderr.splitlines()[-1].endswith(") was ended with the run"), res.stderr


@pytest.mark.kernel
def test_count_with_lines_shows_them(chain):
    res = run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 2", "--lines")
    assert res.returncode == 0, res.stderr
    frames = [l.strip() for l in res.stdout.splitlines() if l.startswith("  ")]
    d, c = frames[0], frames[1]
    assert d.startswith("d [chain] ") and "chain.c:" in d, res.stdout
    assert c.startswith("c [chain] ") and "chain.c:" in c, res.stdout


def test_empty_command_is_refused_not_system_wide():
    one_line_error(run_ustack("count", "syscall:write", "-c", ""),
                   "-c needs a command (an empty one would trace the whole system)")


@pytest.mark.kernel
def test_a_kernel_thread_is_refused():
    kthreadd = 2                                   # always a kernel thread
    with open(f"/proc/{kthreadd}/comm") as f:
        assert f.read().strip() == "kthreadd"
    one_line_error(run_ustack("count", "syscall:write", "-p", str(kthreadd)),
                   "PID 2 is a kernel thread: it has no user stack")


@pytest.mark.parametrize("spec, number", [("uprobe:/bin/true:01230", "01230"),
                                          ("uprobe:/bin/true:main+010", "010")])
def test_a_number_with_a_leading_zero_is_ambiguous(spec, number):
    digits = number.lstrip("0")
    one_line_error(run_ustack("trace", spec, "-c", "true"),
                   f"ambiguous number '{number}': write 0x{digits} for hex or "
                   f"{int(digits)} for decimal")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_duration_must_be_a_finite_positive_number(value):
    one_line_error(run_ustack("count", "syscall:write", "-d", value, "-c", "true"),
                   "--duration must be a positive number of seconds")


def test_options_are_not_abbreviated():
    res = run_ustack("profile", "--comman", "ls")      # not --command
    assert res.returncode == 1
    assert "unrecognized arguments: --comman ls" in res.stderr


def test_version():
    res = run_ustack("--version")
    assert res.returncode == 0
    assert res.stdout.startswith("ustack ") and res.stdout.strip() != "ustack"



@pytest.mark.parametrize("backend, runs_as", [("bpf", "count"), ("perf", "trace")])
def test_record_is_the_command_of_a_record_run(backend, runs_as):
    from ustack.cli import build_parser
    from ustack.commands.record import record_options
    args = build_parser("record").parse_args(
        ["record", "syscall:write", "-c", "true", "--backend", backend])
    opts = record_options(args)
    assert (opts.command, opts.runs_as, opts.record, opts.output_path) == \
        ("record", runs_as, "ustack.data", None)


def test_help_lists_every_event_kind_and_what_diff_writes():
    trace = run_ustack("trace", "--help")
    assert trace.returncode == 0
    for kind in ("syscall:", "uprobe:", "uretprobe:", "usdt:", "tracepoint:", "profile:hz:"):
        assert kind in trace.stdout, kind
    report = " ".join(run_ustack("report", "--help").stdout.split())
    assert "differential flame graph of two recordings, written as HTML only" in report
    record = " ".join(run_ustack("record", "--help").stdout.split())
    assert "with no EVENT, as profile does: 49 Hz" in record


def test_weight_beyond_the_arguments_is_said_as_written(chain):
    res = run_ustack("count", f"uprobe:{chain}:d", "--weight", "arg9", "-c", f"{chain} 1")
    one_line_error(res, "--weight arg9: a uprobe's arguments are arg0…arg8 "
                        "(a C function's arg0…arg5)")
    res = run_ustack("count", f"uprobe:{chain}:d", "--weight", "arg6", "-c", f"{chain} 1")
    one_line_error(res, "--weight arg6 ($arg7): a C function's arguments in registers "
                        "are arg0…arg5")
