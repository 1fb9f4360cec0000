"""Stacks the in-kernel walk defers to ustack (an object whose rows are
not loaded yet, or do not fit the table) are unwound with the rows the
kernel uses: a Go binary's from its .gopclntab, with the frames that run
on another stack. With an empty cache nothing is built before a -c
command starts: its first events, a burst of thousands included, are
deferred and whole."""
from __future__ import annotations

import pytest

from helpers import (O2_NOFP, build, build_go, funcs, ok, parse_counts, parse_folded, parse_trace,
                     run_ustack)

pytestmark = pytest.mark.kernel

HZ = 499
# each run starts from a cache of its own: no rows built before
ROOTS = {"runtime.goexit.abi0", "runtime.goexit"}


def _empty_cache(tmp_path, name: str) -> dict:
    from helpers import ustack_env
    return dict(ustack_env(), USTACK_CACHE_DIR=str(tmp_path / name))


def test_deferred_samples_in_time_now_are_whole(tmp_path):
    """time.now reads the clock through the vDSO on the thread's g0 stack:
    its callers are on the goroutine's stack, away from sp. Rows too big
    for the table (--unwind-memory) defer every Go sample to ustack, which
    walks onto the copy of that other stack as the kernel walks onto it."""
    gonow = build_go("gonow")
    res = ok(run_ustack("profile", "-F", str(HZ), "--unwind-memory", "0.001",
                        "-f", "folded", "-c", f"{gonow} 6000000",
                        env=_empty_cache(tmp_path, "cache")))
    assert "did not fit the in-kernel table" in res.stderr
    in_now = [(stack, n) for stack, n in parse_folded(res.stdout) if "time.now" in stack]
    assert sum(n for _s, n in in_now) >= 20, res.stdout
    cut = [(stack, n) for stack, n in in_now
           if stack[1] not in ROOTS or stack[1:5] != [stack[1], "runtime.main", "main.main",
                                                    "main.clock"]]
    assert not cut, f"{sum(n for _s, n in cut)} samples in time.now cut: {cut[:3]}"


@pytest.mark.parametrize("language", ["go", "c"])
def test_empty_cache_command_first_events_whole(language, tmp_path):
    """-c with an empty cache: the rows are built after the start (the
    run says so), and every write the program makes, its first included,
    has its whole stack."""
    if language == "go":
        target = f"{build_go('gochain')} 3 write"
        # two frameless assembly leaves first: a frame-pointer walk loses one
        want = ["runtime/internal/syscall.Syscall6", "syscall.RawSyscall6", "syscall.Syscall",
                "syscall.write", "main.d", "main.(*T).c", "main.b", "main.a", "main.main",
                "runtime.main", "runtime.goexit.abi0"]
    else:
        target = f"{build('chain', flags=O2_NOFP)} 3 write"
        want = ["write", "d", "c", "b", "a", "main"]
    out = tmp_path / "trace.txt"
    res = ok(run_ustack("trace", "syscall:write", "-o", out, "-c", target,
                        env=_empty_cache(tmp_path, "cache")))
    assert "built after the start" in res.stderr, res.stderr
    records = parse_trace(out.read_text())
    assert len(records) == 3, out.read_text()
    for rec in records:
        names = funcs(rec["frames"])
        assert not rec["notes"], rec
        if language == "go":
            assert names == want
        else:                           # libc's start-up frames after main
            assert [n for n in names if n in want] == want, names
            assert names[0] in ("write", "__GI___libc_write"), names


# hits of a probe in a command's first milliseconds: thrice what a ring of
# fixed 10 KiB records held (~400), all before the command's rows are in
BURST = 3000


def test_a_commands_first_burst_is_counted_whole(tmp_path):
    """-c with an empty cache: chain's d is hit 3,000 times within its
    first milliseconds, before any row is built (every stack is deferred
    to ustack): all 3,000 are counted with their whole stack, none cut."""
    chain = build("chain", flags=O2_NOFP)
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} {BURST}",
                        env=_empty_cache(tmp_path, "cache")))
    assert "built after the start" in res.stderr, res.stderr
    stacks = [(funcs(s["frames"]), s["count"]) for s in parse_counts(res.stdout)]
    assert stacks == [(["d", "c", "b", "a", "main", "__libc_start_call_main",
                        "__libc_start_main", "_start"], BURST)], res.stdout + res.stderr
    assert "cut short" not in res.stderr, res.stderr
