"""The BPF backend: stacks and calls counted in the kernel.

Oracles: the perf backend's output on the same run (the kernel walks the
same frame pointers; only where the counting happens differs), the known
call chain of chain.c (d called exactly N times from main→a→b→c), and
/proc/kallsyms for kernel frames."""
from __future__ import annotations

import os
import signal
import subprocess

import pytest

from helpers import (CHAIN, FP, O2_FP, build, fail_one_line, finish, funcs, ok,
                     parse_counts, parse_folded, release, run_ustack, spawn, start_ustack,
                     stop, wait_tracing)

pytestmark = pytest.mark.kernel


def header(res) -> str:
    return res.stderr.splitlines()[0]


@pytest.fixture(params=[FP, O2_FP], ids=["O0", "O2"], scope="module")
def chain(request):
    return build("chain", flags=request.param)


def both(*args):
    """The same run through the bpf and the perf backends (fp unwinding)."""
    bpf = ok(run_ustack(*args, "--backend", "bpf", "--unwind", "fp"))
    perf = ok(run_ustack(*args, "--backend", "perf", "--unwind", "fp"))
    assert "[backend bpf, unwind fp]" in header(bpf)
    assert "[backend perf, unwind fp]" in header(perf)
    return bpf, perf


@pytest.mark.parametrize("where", ["d", "d+1"])
def test_count_exact_and_identical_to_perf(chain, where):
    """At d+1 (after push %rbp) the FP walk skips c: the word read at sp in
    the kernel must put it back, as the perf path does."""
    n = 1000
    bpf, perf = both("count", f"uprobe:{chain}:{where}", "-c", f"{chain} {n}")
    stacks = parse_counts(bpf.stdout)
    assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, n)]
    assert bpf.stdout == perf.stdout
    assert "not counted" not in bpf.stderr


def test_auto_gives_one_root_for_every_event_of_a_program(chain):
    """A binary with frame pointers: auto unwinds its uprobe and its
    syscall stacks alike (DWARF, in the kernel), so both reach _start and
    one flame graph has one root (frame pointers stopped the uprobe's at
    __libc_start_call_main, inside libc, which keeps none)."""
    inkernel = "[backend bpf, unwind dwarf; unwound in the kernel]"
    probe = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 3"))
    write = ok(run_ustack("count", "syscall:write", "-c", f"{chain} 3 write"))
    roots = set()
    for res in (probe, write):
        assert inkernel in header(res), header(res)
        (stack,) = [s for s in parse_counts(res.stdout) if "d" in funcs(s["frames"])]
        assert funcs(stack["frames"])[-1] == "_start", stack["frames"]
        roots.add(tuple(funcs(stack["frames"])[-3:]))
    assert len(roots) == 1, roots


def test_count_follows_the_children_of_a_command_and_of_a_pid(chain):
    """Syscalls of the processes a -c command or a -p process forks after
    the start are counted, by the in-kernel programs as by perf's inherited
    events; other processes' are not (the same program runs elsewhere)."""
    script = f"{chain} 2 write; {chain} 1 write"
    res = ok(run_ustack("count", "-P", "syscall:write", "-c", f"sh -c '{script}'"))
    assert "unwound in the kernel" in header(res)
    mine = [s for s in parse_counts(res.stdout) if s["comm"] == "chain"]
    assert sorted(s["count"] for s in mine) == [1, 2], res.stdout
    for s in mine:
        assert funcs(s["frames"])[:6] == ["write"] + CHAIN
    target = spawn("sh", "-c", f"read line; {script}", stdin=subprocess.PIPE)
    bystander = spawn("sh", "-c", f"read line; {chain} 4 write", stdin=subprocess.PIPE)
    us = start_ustack("count", "-P", "syscall:write", "-p", str(target.pid),
                      stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        release(bystander)
        release(target)
        assert target.wait(timeout=10) == 0 and bystander.wait(timeout=10) == 0
        out, err = finish(us)
    finally:
        stop(us)
        stop(target)
        stop(bystander)
    assert us.returncode == 0, err
    mine = [s for s in parse_counts(out) if s["comm"] == "chain"]
    assert sorted(s["count"] for s in mine) == [1, 2], out


def test_dwarf_request_unwinds_in_the_kernel(chain):
    """--backend bpf --unwind dwarf: DWARF rules walked by the BPF program
    (tests/test_bpf_unwind.py compares its stacks with perf's)."""
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 3",
                        "--backend", "bpf", "--unwind", "dwarf"))
    assert "[backend bpf, unwind dwarf; unwound in the kernel]" in header(res)
    assert "note:" not in res.stderr
    assert [s["count"] for s in parse_counts(res.stdout)] == [3]


def test_folded_identical_to_perf(chain):
    bpf, perf = both("count", f"uprobe:{chain}:d", "-c", f"{chain} 100",
                     "-f", "folded")
    rows = parse_folded(bpf.stdout)
    assert len(rows) == 1 and rows[0][1] == 100
    assert rows[0][0][0] == "chain" and rows[0][0][-5:] == CHAIN[::-1]
    assert bpf.stdout == perf.stdout


def test_per_pid_split(chain):
    """Two processes of one command: -P keeps them apart with comm and pid."""
    cmd = f"sh -c '{chain} 3; {chain} 5'"
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", cmd, "-P",
                        "--backend", "bpf"))
    stacks = parse_counts(res.stdout)
    assert [(funcs(s["frames"])[:5], s["comm"], s["count"]) for s in stacks] == \
        [(CHAIN, "chain", 3), (CHAIN, "chain", 5)]
    assert stacks[0]["pid"] != stacks[1]["pid"]
    folded = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", cmd, "-P",
                           "-f", "folded", "--backend", "bpf"))
    rows = parse_folded(folded.stdout)
    assert sorted(n for _, n in rows) == [3, 5]
    assert all(r[0][0].startswith("chain-") and r[0][-1] == "d" for r in rows)
    merged = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", cmd, "--backend", "bpf"))
    assert [s["count"] for s in parse_counts(merged.stdout)] == [8]


def test_syscall_tracepoint_identical_to_perf(chain):
    """rawwrite makes the syscall inside d, so frame pointers see d..main."""
    bpf, perf = both("count", "syscall:write", "-c", f"{chain} 50 rawwrite")
    stacks = parse_counts(bpf.stdout)
    assert [(funcs(s["frames"])[:5], s["count"]) for s in stacks] == [(CHAIN, 50)]
    assert bpf.stdout == perf.stdout


def test_syscalls_before_exec_not_counted(chain):
    """A -c command is held in a fork of ustack until its execve; the
    Python code on the way there makes syscalls the run must not count.
    chain makes exactly one exit_group; so must the report."""
    res = ok(run_ustack("count", "syscall:exit_group", "-c", f"{chain} 1",
                        "--backend", "bpf"))
    assert sum(s["count"] for s in parse_counts(res.stdout)) == 1
    res = ok(run_ustack("count", "syscall:execve", "-c", f"{chain} 1",
                        "--backend", "bpf"))
    assert res.stdout == ""


def test_kernel_stacks(chain):
    res = ok(run_ustack("count", "syscall:write", "-c", f"{chain} 20 rawwrite",
                        "--backend", "bpf", "--kernel"))
    [stack] = parse_counts(res.stdout)
    names = funcs(stack["frames"])
    sep = names.index("--")
    kernel = stack["frames"][:sep]
    assert kernel and all(m == "kernel" for _, m in kernel)
    with open("/proc/kallsyms") as f:
        ksyms = {line.split()[2] for line in f}
    assert all(fn in ksyms for fn, _ in kernel)
    assert "do_syscall_64" in names[:sep]
    assert names[sep + 1:sep + 6] == CHAIN and stack["count"] == 20


def test_profile_through_bpf():
    busy = build("busy", flags=O2_FP)
    res = ok(run_ustack("profile", "-F", "99", "-c", f"{busy} 1", "--backend", "bpf",
                        "--unwind", "fp"))
    assert "[backend bpf, unwind fp]" in header(res)
    stacks = parse_counts(res.stdout)
    top = stacks[-1]                       # most frequent last
    assert funcs(top["frames"])[:3] == ["spin_here", "work", "main"]
    assert top["count"] >= sum(s["count"] for s in stacks) // 2


@pytest.mark.parametrize("unwind, why", [("fp", "had a stack id collision"),
                                          ("auto", "found the stack map full")])
def test_small_stack_storage_reports_lost(chain, unwind, why):
    """One stack slot: c's stack takes it, each of d's N calls then finds it
    taken (the kernel's stack map of frame pointers: a collision)."""
    n = 40
    res = ok(run_ustack("count", f"uprobe:{chain}:c", f"uprobe:{chain}:d",
                        "-c", f"{chain} {n}", "--backend", "bpf", "--unwind", unwind,
                        "--stack-storage-size", "1"))
    stacks = parse_counts(res.stdout)
    assert [(funcs(s["frames"])[:4], s["count"]) for s in stacks] == [(CHAIN[1:], 1)]
    assert (f"{n} events were not counted ({n} {why}): "
            "try --stack-storage-size 4") in res.stderr.splitlines()


def test_funccount_glob_exact(chain):
    res = ok(run_ustack("funccount", f"{chain}:[a-d]", "-c", f"{chain} 37"))
    assert res.stdout.splitlines() == [
        "FUNC                                    COUNT",
        "a                                           1",
        "b                                           1",
        "c                                           1",
        "d                                          37"]


def test_funccount_interval_resets(tmp_path):
    busy = build("busy", flags=O2_FP)
    res = ok(run_ustack("funccount", f"{busy}:[a-z]*", "-i", "0.4",
                        "-c", f"{busy} 1"))
    tables = [t.splitlines()[1:] for t in res.stdout.split("\n\n")]
    rows = [dict((r.split()[0], int(r.split()[1])) for r in t) for t in tables]
    assert len(rows) >= 2                  # printed during the run and at its end
    total: dict = {}
    for r in rows:
        for k, v in r.items():
            total[k] = total.get(k, 0) + v
    # each function ran once: one interval counted it, the reset forgot it
    assert total["main"] == total["work"] == total["spin_here"] == 1


def test_funccount_errors(chain):
    res = run_ustack("funccount", f"{chain}:zz*", "-c", f"{chain} 1")
    assert res.returncode == 1 and res.stderr.startswith("ustack: ")
    assert len(res.stderr.splitlines()) == 1
    res = run_ustack("funccount", f"{chain}:d", "-i", "0")
    assert res.stderr == "ustack: -i must be a positive number of seconds\n"


def test_verifier_log_on_refusal():
    """A program that returns an unset r0: the error names the verifier's reason."""
    from ustack.kernel import bpf_syscall
    if os.geteuid() != 0:
        pytest.skip("needs root for bpf(2)")
    code = bpf_syscall.Asm().emit(bpf_syscall.exit_()).assemble()
    with pytest.raises(bpf_syscall.LoadError) as e:
        bpf_syscall.load_program(bpf_syscall.PROG_KPROBE, code, "bad")
    lines = str(e.value).splitlines()
    assert lines[0] == "the kernel refused BPF program bad: Permission denied"
    assert "R0 !read_ok" in lines


def test_assembler_resolves_jumps():
    """Named forward jumps become the right offsets; ld_imm64 counts twice."""
    from ustack.kernel import bpf_syscall as b
    a = b.Asm()
    a.jump(b.jmp_imm, b.JEQ, 1, 0, to="end")
    a.emit(b.ld_map_fd(2, 7), b.mov_imm(0, 1))
    a.label("end")
    a.emit(b.exit_())
    code = a.assemble()
    assert len(code) == 5 * 8
    assert code[2:4] == (3).to_bytes(2, "little")        # skip 16 + 8 bytes
    assert code[8] == 0x18 and code[9] == 0x12 and code[12] == 7


def test_profile_running_process():
    """-p: the events follow an existing process; counted in the kernel."""
    import subprocess
    busy = build("busy", flags=O2_FP)
    # spins far longer than ustack takes to start; -d ends the run, we the process
    proc = subprocess.Popen([str(busy), "600"])
    try:
        res = ok(run_ustack("profile", "-F", "99", "-p", proc.pid, "-d", "1",
                            "-P", "--backend", "bpf"))
    finally:
        proc.kill()
        proc.wait()
    stacks = parse_counts(res.stdout)
    top = stacks[-1]
    assert funcs(top["frames"])[:3] == ["spin_here", "work", "main"]
    assert (top["comm"], top["pid"]) == ("busy", proc.pid)


def test_kernel_stacks_need_in_kernel_counting(chain):
    res = run_ustack("count", "--kernel", "--backend", "perf", "syscall:write",
                     "-c", f"{chain} 1")
    assert fail_one_line(res) == ("ustack: --kernel needs in-kernel counting "
                                  "(--backend bpf), not --backend perf")


def test_funccount_running_process_for_a_duration(chain):
    """-p and -d: calls of a process that was already running, counted for
    one second, and the process is left running."""
    proc = spawn(chain, 10 ** 12)
    try:
        res = ok(run_ustack("funccount", f"{chain}:d", "-p", proc.pid, "-d", "1"))
        (head, row) = res.stdout.splitlines()
        assert head.split() == ["FUNC", "COUNT"]
        assert row.split()[0] == "d" and int(row.split()[1]) > 0, res.stdout
        assert proc.poll() is None
    finally:
        stop(proc)


def test_profile_folded_through_bpf():
    busy = build("busy", flags=O2_FP)
    res = ok(run_ustack("profile", "-F", "99", "-f", "folded", "-c", f"{busy} 1",
                        "--backend", "bpf"))
    rows = parse_folded(res.stdout)
    stack, n = max(rows, key=lambda r: r[1])
    assert stack[0] == "busy" and stack[-3:] == ["main", "work", "spin_here"], rows
    assert n >= sum(c for _s, c in rows) // 2, rows


def test_counting_in_the_kernel_blinds_no_other_tool(chain):
    """A trace event has one BPF program list, run for every perf event on
    it: a program returning 0 would drop the hit for every other perf user
    too (another ustack, perf record). While a system-wide bpf run counts
    write(2), a perf-backend trace of write(2) still sees all of its own."""
    from helpers import finish, start_ustack, wait_tracing
    counter = start_ustack("count", "syscall:write", "-d", "60", "--backend", "bpf")
    try:
        wait_tracing(counter)
        res = ok(run_ustack("trace", "syscall:write", "-c", f"{chain} 3 write"))
        assert res.stdout.count(": syscall:write\n") == 3
    finally:
        counter.send_signal(signal.SIGINT)      # ends cleanly: removes its probes
        finish(counter)
