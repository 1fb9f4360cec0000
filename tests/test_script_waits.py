"""Ruby, PHP and Perl frames in the stacks of offcpu, latency and memleak,
as in a profile's: each mode's own program merges them (offcpu.bpf.c,
latency.bpf.c, memleak.bpf.c run php.h's, perl.h's and ruby.h's passes).

programs/{ruby,php,perl}/waits.* are the oracle: their leaf, at the end
of a known call chain, sleeps a millisecond in libc and keeps a new block,
TIMES times, once released on stdin; it says "done" and holds its blocks
until stdin ends. Every blocked millisecond, every sleep's entry and
every kept block must carry the chain in order."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import finish, ok, parse_folded, start_ustack, stop, wait_tracing

pytestmark = pytest.mark.kernel

PROGRAMS = Path(__file__).parent / "programs"
TIMES = 60
BLOCK = 65_536          # each call's kept block


class Script:
    """One runtime's waits.* script: how to run it, its chain (outermost
    first, by name), the libc function its sleep blocks in, and what its
    environment needs for its blocks to come from libc's allocator."""

    def __init__(self, runtime: str, path: str, chain: list, sleeps_in: str,
                 env: dict | None = None):
        self.runtime, self.path = runtime, PROGRAMS / path
        self.chain, self.sleeps_in, self.env = chain, sleeps_in, env

    def argv(self) -> list:
        exe = shutil.which(self.runtime)
        if exe is None:
            pytest.skip(f"{self.runtime} is not installed: no {self.runtime} frames to show")
        return [exe, str(self.path), str(TIMES)]

    def folded_chain(self, stack: list) -> list:
        """The script's frames of a folded stack, outermost first, by name."""
        tag = f" ({self.path.name}:"
        return [f.split(tag)[0] for f in stack if tag in f]


SCRIPTS = {
    "ruby": Script("ruby", "ruby/waits.rb", ["<main>", "Object#a", "block in Object#a", "Object#b", "Worker#c"],
                   "ppoll"),
    # PHP's own allocator takes memory from mmap'd chunks it trims (the
    # block's start unmapped at once): its blocks come from malloc so
    "php": Script("php", "php/waits.php", ["{main}", "a", "b", "Waiter::wait"],
                  "usleep", env={"USE_ZEND_ALLOC": "0"}),
    "perl": Script("perl", "perl/waits.pl", ["<main>", "main::a", "main::b", "Work::c"],
                   "select"),
}


@pytest.fixture(params=sorted(SCRIPTS))
def script(request) -> Script:
    return SCRIPTS[request.param]


def attached(script: Script, *args) -> str:
    """`ustack ARGS -p SCRIPT` over the script's TIMES calls: released once
    ustack traces, ended (Ctrl-C) once it says it is done, its blocks
    still held; ustack's stdout."""
    target = subprocess.Popen(script.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env={**os.environ, **(script.env or {})})
    try:
        us = start_ustack(*args, "-p", target.pid, stdout=subprocess.PIPE)
        try:
            header = wait_tracing(us, timeout=60)
            target.stdin.write(b"go\n")
            target.stdin.flush()
            assert target.stdout.readline() == b"done\n"
            us.send_signal(signal.SIGINT)
            out, err = finish(us, timeout=60)
        finally:
            stop(us)
        target.stdin.close()
        assert target.wait(timeout=30) == 0
    finally:
        stop(target)
    ok(subprocess.CompletedProcess(us.args, us.returncode, out, header + err))
    return out


def test_offcpu_time_in_the_sleep_carries_the_chain(script):
    rows = parse_folded(attached(script, "offcpu", "-f", "folded"))
    sleeping = [(stack, us) for stack, us in rows if script.sleeps_in in stack]
    total = sum(us for _stack, us in sleeping)
    whole = sum(us for stack, us in sleeping if script.folded_chain(stack) == script.chain)
    assert total >= TIMES * 1000, rows        # folded: microseconds
    assert whole >= 0.9 * total, [(script.folded_chain(s), us) for s, us in sleeping]


def test_latency_entry_stacks_carry_the_chain(script):
    """latency --by-stack on the libc function the sleep blocks in: the
    stack of its TIMES calls shows the chain, innermost first."""
    out = attached(script, "latency", "--by-stack", f"uprobe:libc:{script.sleeps_in}")
    tag = f" [{script.runtime}] "
    named = [line.strip().split(tag)[0] for line in out.splitlines() if tag in line]
    assert named[:len(script.chain)] == script.chain[::-1], out[-3000:]
    calls = re.search(r": count (\d+),", out)
    assert calls and int(calls.group(1)) >= TIMES, out[-3000:]


def test_memleak_blocks_kept_by_the_leaf_carry_the_chain(script):
    rows = parse_folded(attached(script, "memleak", "-f", "folded"))
    kept = sum(n for stack, n in rows if script.folded_chain(stack) == script.chain)
    assert kept >= TIMES * BLOCK, [(script.folded_chain(s), n) for s, n in rows][-20:]
