"""End to end on the other target programs: a CPU profile (busy), threads,
a dlopen()ed plugin, Go, a library named by its short name, and system-wide
counting. Parsers and process helpers come from helpers.py."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

import pytest

from helpers import (PLUGIN_CHAIN, build, build_go, finish, funcs, gdb_backtrace, ok,
                     parse_counts, parse_folded, parse_trace, private_copy, release,
                     run_attached, run_ustack, spawn, start_ustack, stop, wait_tracing)

CHAIN = ["d", "c", "b", "a", "main"]
GO_CHAIN = ["main.d", "main.(*T).c", "main.b", "main.a", "main.main", "runtime.main"]

# A -p target is started with "-" (threads, dlopen_main) or behind a shell's
# `read`: it waits for a line on stdin, written once ustack is tracing.
WAIT = "-"


# --- 3. profile -------------------------------------------------------------------

@pytest.mark.kernel
def test_profile_busy():
    busy = build("busy")
    res = ok(run_ustack("profile", "-F", "199", "-c", f"{busy} 1"))
    stacks = parse_counts(res.stdout)
    assert stacks, res.stdout
    total = sum(s["count"] for s in stacks)
    top = stacks[-1]                        # least to most frequent
    assert top["count"] == max(s["count"] for s in stacks), "not sorted by count"
    assert [s["count"] for s in stacks] == sorted(s["count"] for s in stacks)
    assert top["frames"][:3] == [("spin_here", "busy"), ("work", "busy"), ("main", "busy")]
    assert top["count"] > 0.8 * total, f"{top['count']} of {total} samples"


# --- 4. threads --------------------------------------------------------------------

def _thread_stack_ok(res, n):
    stacks = parse_counts(res.stdout)
    assert len(stacks) == 1, res.stdout
    assert stacks[0]["frames"][:3] == [("thread_d", "threads"), ("thread_a", "threads"),
                                       ("worker", "threads")], res.stdout
    assert stacks[0]["count"] == n, res.stderr


@pytest.mark.kernel
def test_threads_command():
    prog = build("threads")
    res = ok(run_ustack("count", f"uprobe:{prog}:thread_d", "-c", f"{prog} 300 5"))
    _thread_stack_ok(res, 10)                       # 2 threads x 5 calls
    assert funcs(parse_counts(res.stdout)[0]["frames"])[:3] == \
        gdb_backtrace(prog, [0, 5], "thread_d")[:3]


@pytest.mark.kernel
def test_threads_pid():
    prog = build("threads")
    target = spawn(prog, WAIT, 5, stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "count", f"uprobe:{prog}:thread_d"))
        _thread_stack_ok(res, 10)
        assert target.wait(timeout=10) == 0, "the target failed under tracing"
    finally:
        stop(target)


@pytest.mark.kernel
def test_pid_target_exit_seen_while_unreaped():
    """-p ends when the process exits, even if its parent has not reaped it
    yet (a zombie keeps /proc/PID; its perf events hang up all the same)."""
    prog = build("threads")
    target = subprocess.Popen([str(prog), WAIT, "5"],  # nobody reaps it
                              stdin=subprocess.PIPE)
    try:
        us = start_ustack("count", f"uprobe:{prog}:thread_d", "-p", target.pid,
                          stdout=subprocess.PIPE)
        try:
            wait_tracing(us)
            release(target)
            out, err = finish(us, timeout=15)
        finally:
            stop(us)
        assert us.returncode == 0, err
        assert [(s["frames"][:1], s["count"]) for s in parse_counts(out)] == \
            [([("thread_d", "threads")], 10)], out
        assert target.wait(timeout=5) == 0
    finally:
        stop(target)


# --- 5. dlopen ------------------------------------------------------------------------


@pytest.mark.kernel
def test_dlopen_command():
    prog, plugin = build("dlopen_main"), build("plugin", kind="shared")
    res = ok(run_ustack("count", f"uprobe:{plugin}:plugin_leaf",
                        "-c", f"{prog} 300 {plugin} 3"))
    stacks = parse_counts(res.stdout)
    assert [(s["frames"][:4], s["count"]) for s in stacks] == [(PLUGIN_CHAIN, 3)], res.stdout
    assert funcs(stacks[0]["frames"])[:4] == gdb_backtrace(prog, [0, plugin, 3], "plugin_leaf")


@pytest.mark.kernel
def test_dlopen_pid_probe_before_load():
    """The probe is placed on plugin.so before the process dlopen()s it."""
    prog, plugin = build("dlopen_main"), build("plugin", kind="shared")
    target = spawn(prog, WAIT, plugin, 3, stdin=subprocess.PIPE)
    try:
        maps = open(f"/proc/{target.pid}/maps").read()
        assert str(plugin) not in maps, "the plugin is loaded already: too late"
        res = ok(run_attached(target, "count", f"uprobe:{plugin}:plugin_leaf"))
        stacks = parse_counts(res.stdout)
        assert [(s["frames"][:4], s["count"]) for s in stacks] == [(PLUGIN_CHAIN, 3)], \
            res.stdout
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)


# --- 6. Go ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gochain():
    return build_go("gochain")


@pytest.mark.kernel
@pytest.mark.parametrize("func", ["main.(*T).c", "main.d"])
def test_go_uprobe(gochain, func):
    n = 3
    res = ok(run_ustack("count", f"uprobe:{gochain}:{func}", "-c", f"{gochain} {n}"))
    assert "exited with status" not in res.stderr and "was killed by" not in res.stderr, \
        "ustack harmed the Go program"
    stacks = parse_counts(res.stdout)
    want = GO_CHAIN[GO_CHAIN.index(func):]
    count = 1 if func == "main.(*T).c" else n
    assert len(stacks) == 1, res.stdout
    assert stacks[0]["frames"][:len(want)] == [(f, "gochain") for f in want], res.stdout
    assert stacks[0]["count"] == count
    oracle = gdb_backtrace(gochain, [n], func)
    assert oracle and funcs(stacks[0]["frames"])[:len(oracle)] == oracle


def _after_stack_check(binary, func: str) -> int:
    """The offset in `func` of the instruction after its stack-growth
    check (`cmp 0x10(%r14),%rsp; jbe …`), by objdump."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)],
                          capture_output=True, text=True, check=True).stdout
    body = text.split(f"<{func}>:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    addrs = [int(line.split(":")[0], 16) for line in body]
    jbe = next(i for i, line in enumerate(body) if "\tjbe " in line)
    return addrs[jbe + 1] - addrs[0]


@pytest.mark.kernel
def test_go_trace_exit_status(gochain):
    """A traced Go program still runs to completion with status 0 (it exits
    3 if main.d ran a wrong number of times)."""
    res = ok(run_ustack("trace", f"uprobe:{gochain}:main.d", "-c", f"{gochain} 4"))
    assert "exited with status" not in res.stderr and "was killed by" not in res.stderr, \
        res.stderr
    records = parse_trace(res.stdout)
    assert len(records) == 4
    past_check = _after_stack_check(gochain, "main.d")
    for rec in records:
        assert funcs(rec["frames"])[:6] == GO_CHAIN, rec
        # the probe sits after Go's stack-growth check, so a call whose
        # stack grows (it runs again from its start) is seen once
        assert rec["frames"][0]["off"] == past_check
    # and run by -p: the process must exit 0 on its own
    target = spawn("sh", "-c", f"read line && exec {gochain} 5", stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "count", f"uprobe:{gochain}:main.d"))
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    stacks = parse_counts(res.stdout)
    assert [(funcs(s["frames"])[:6], s["count"]) for s in stacks] == [(GO_CHAIN, 5)], res.stdout


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_go_calls_whose_stack_grows_count_once(tmp_path, backend):
    """golatency's main.work needs more stack than its new goroutine has:
    runtime.morestack grows it and runs the function again from its first
    instruction; main.grow recurses 2,000 deep, its stack copied on the
    way. Each call is counted once (a probe on the first instruction saw
    those calls twice)."""
    prog = build_go("golatency")
    command = f"{prog} {tmp_path / 'out'} 1 2"       # 2 calls of main.work
    res = ok(run_ustack("count", f"uprobe:{prog}:main.work", "--backend", backend,
                        "-c", command))
    stacks = parse_counts(res.stdout)
    assert sum(s["count"] for s in stacks) == 2, res.stdout
    assert all(funcs(s["frames"])[0] == "main.work" for s in stacks), res.stdout
    # grow(2000) from main, then from each call of work: 3 x 2,001 calls
    res = ok(run_ustack("funccount", f"{prog}:main.grow", "-c", command))
    assert re.search(r"^main\.grow\s+6003$", res.stdout, re.M), res.stdout


@pytest.mark.kernel
def test_go_syscall_write(gochain):
    n = 3
    # the Go program writes to fd 1: send it to /dev/null, not into ustack's output
    res = ok(run_ustack("count", "syscall:write",
                        "-c", f"sh -c 'exec {gochain} {n} write >/dev/null'"))
    stacks = parse_counts(res.stdout)
    assert sum(s["count"] for s in stacks) == n, res.stdout
    for s in stacks:
        names = funcs(s["frames"])
        assert "main.d" in names, names
        assert names[names.index("main.d"):][:6] == GO_CHAIN, names
        assert all(mod == "gochain" for _, mod in s["frames"])
    oracle = gdb_backtrace(gochain, [1], "main.d")
    names = funcs(stacks[0]["frames"])
    assert names[names.index("main.d"):][:len(oracle)] == oracle


# --- 8. a library by its short name -----------------------------------------------------

@pytest.mark.kernel
def test_libc_short_name():
    prog, plugin = build("dlopen_main"), build("plugin", kind="shared")
    res = ok(run_ustack("count", "uprobe:libc:malloc", "-c", f"{prog} 0 {plugin} 3"))
    assert "libc.so.6:malloc" in res.stderr.splitlines()[0], res.stderr
    stacks = parse_counts(res.stdout)
    assert sum(s["count"] for s in stacks) >= 1, res.stdout
    for s in stacks:
        assert s["frames"][0] == ("malloc", "libc.so.6"), s


# --- 9. system-wide ------------------------------------------------------------------------

def _system_wide(prog, *extra) -> str:
    """count uprobe:PROG:d for 2 s with no target while PROG 7 runs twice."""
    us = start_ustack("count", f"uprobe:{prog}:d", "-d", "2", *extra,
                      stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        for _ in range(2):
            assert subprocess.run([str(prog), "7"], timeout=10).returncode == 0
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    assert "Traceback" not in err
    return out


@pytest.mark.kernel
def test_system_wide_count(tmp_path):
    prog = private_copy(build("chain"), tmp_path)
    out = _system_wide(prog)
    stacks = parse_counts(out)
    assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, 14)], out


@pytest.mark.kernel
def test_system_wide_per_pid(tmp_path):
    prog = private_copy(build("chain"), tmp_path)
    out = _system_wide(prog, "-P")
    stacks = parse_counts(out)
    assert [(funcs(s["frames"])[:5], s["count"], s["comm"]) for s in stacks] == \
        [(CHAIN, 7, "chain")] * 2, out
    assert stacks[0]["pid"] != stacks[1]["pid"]


@pytest.mark.kernel
def test_system_wide_folded_per_pid(tmp_path):
    prog = private_copy(build("chain"), tmp_path)
    out = _system_wide(prog, "-P", "-f", "folded")
    rows = parse_folded(out)
    assert len(rows) == 2, out
    for stack, n in rows:
        assert n == 7
        assert stack[-5:] == CHAIN[::-1], stack
        assert re.fullmatch(r"chain-\d+", stack[0]), stack    # comm-pid with -P
    assert rows[0][0][0] != rows[1][0][0]


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "tracefs"])
def test_system_wide_trace_leaves_out_ustack_itself(tmp_path, backend):
    """Tracing every write on the machine must not trace ustack's own
    writes of what it traced (a feedback loop)."""
    prog = build("chain")
    us = start_ustack("trace", "syscall:write", "-d", "2", "--backend", backend,
                      stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        writer = subprocess.Popen([str(prog), "3", "write"])
        assert writer.wait(timeout=10) == 0
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    events = parse_trace(out)
    assert not [e for e in events if e["pid"] == us.pid], "ustack traced itself"
    assert sum(e["pid"] == writer.pid for e in events) == 3, out


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "bpf"])
def test_system_wide_profile_leaves_out_idle_and_ustack(tmp_path, backend):
    busy = tmp_path / "selfbusy"
    shutil.copy2(build("busy"), busy)
    us = start_ustack("profile", "-F", "199", "-d", "2", "-P", "-f", "folded",
                      "--backend", backend, stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        assert subprocess.run([str(busy), "0.3"], timeout=10).returncode == 0
        out, err = finish(us)
    finally:
        stop(us)
    assert us.returncode == 0, err
    pids = {int(stack[0].rpartition("-")[2]) for stack, _n in parse_folded(out)}
    assert 0 not in pids and us.pid not in pids, out
    assert any(stack[0].startswith("selfbusy-") for stack, _n in parse_folded(out)), out


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "bpf"])
def test_system_wide_names_a_process_gone_before_the_end(tmp_path, backend):
    """A process that was running before a system-wide run and exits during
    it: the kernel never reports its mappings (they predate the run) and
    /proc has forgotten it by the time the counts are named."""
    prog = private_copy(build("branches"), tmp_path)
    target = spawn(prog, 3, 2, "-", stdin=subprocess.PIPE)
    us = start_ustack("count", "-P", "--backend", backend, f"uprobe:{prog}:leaf",
                      stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        release(target)
        assert target.wait(timeout=10) == 0
        us.send_signal(signal.SIGINT)
        out, err = finish(us)
    finally:
        stop(us)
        stop(target)
    assert us.returncode == 0, err
    stacks = parse_counts(out)
    assert sorted((s["comm"], s["pid"], funcs(s["frames"])[:3], s["count"])
                  for s in stacks) == [
        ("branches", target.pid, ["leaf", "left", "main"], 3),
        ("branches", target.pid, ["leaf", "right", "main"], 2)], out


@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "bpf"])
def test_events_before_an_exec_are_named_from_the_program_before(backend):
    """`sh -c 'exec PROG > /dev/null'`: the shell's own start-up and its
    open of /dev/null happen in the process that then execs PROG, and are
    read in the same batch as the exec: each event is named from the
    program that ran when it fired, by its time."""
    chain = build("chain")
    shell = os.path.basename(os.path.realpath("/bin/sh"))
    res = ok(run_ustack("trace", "--backend", backend, "syscall:openat", "-c",
                        f"sh -c 'exec {chain} 1 write > /dev/null'"))
    events = parse_trace(res.stdout)
    for e in events:
        modules = {f["module"] for f in e["frames"]}
        assert "[unknown]" not in modules, e     # an address in no mapping
    tops = [e["frames"][-1]["module"] for e in events if e["frames"]]
    assert "ld-linux-x86-64.so.2" in tops and "chain" in tops, tops
    # the redirection: libc's open called from the shell
    assert any(e["frames"][0]["func"] in ("open", "open64", "__libc_open64")
               and e["frames"][-1]["module"] == shell for e in events), res.stdout
