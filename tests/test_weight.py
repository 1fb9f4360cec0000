"""count --weight EXPR: each event adds an argument's value to its stack's
count (bpftrace's `@[ustack] = sum(arg0)`). tests/programs/weights.c calls
take(n, r, tag, delta) 3 times from via_a (n = 100, 200, 300) and 5 times
from via_b (n = 10): the sums per stack are known exactly, on every
backend, in every format; bad expressions fail in one line before any
probe is placed."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from helpers import (O2_NOFP, build, fail_one_line, ok, parse_counts, parse_folded,
                     private_copy, run_attached, run_counts, run_ustack, spawn, top,
                     traces)

pytestmark = pytest.mark.kernel

# the chain each stack ends in (outermost last) -> the expression's sums
CHAINS = {"via_a": ["take", "via_a", "main"], "via_b": ["take", "via_b", "main"]}
SUMS = {"n": {"via_a": 600, "via_b": 50},
        "arg0": {"via_a": 600, "via_b": 50},               # bpftrace's arg0: n
        "+8(%si):u32": {"via_a": 60, "via_b": 5},          # r->size = n / 10
        "delta": {"via_a": -600, "via_b": -50}}            # an int, negative


@pytest.fixture(scope="module")
def prog() -> Path:
    return build("weights", flags=O2_NOFP)


def by_chain(stacks: list, leaf: str = "take", module: str = "weights") -> dict:
    """via_a/via_b -> the count of the stack through it (each once)."""
    out = {}
    for s in stacks:
        names = [f for f, m in s["frames"] if m == module]
        chain = names[names.index(leaf):names.index("main") + 1]
        key = chain[1]
        assert chain == CHAINS[key] and key not in out, s
        out[key] = s["count"]
    return out


def count(prog, *args, event="take", backend="bpf"):
    return ok(run_ustack("count", "--backend", backend, *args,
                         event if ":" in event else f"uprobe:{prog}:{event}",
                         "-c", str(prog)))


@pytest.mark.parametrize("backend", ["bpf", "perf", "tracefs"])
@pytest.mark.parametrize("expr", list(SUMS))
def test_sums_per_stack_are_exact(prog, backend, expr):
    res = count(prog, "--weight", expr, backend=backend)
    stacks = parse_counts(res.stdout)
    assert by_chain(stacks) == SUMS[expr]
    assert {s["unit"] for s in stacks} == {f"(sum of {expr})"}


def test_frame_pointer_counter_sums_too(prog):
    """counts.bpf.c (--unwind fp) adds the weight as the unwinder does; the
    walk stops in -O2 code without frame pointers, so one stack per caller."""
    res = count(prog, "--weight", "n", "--unwind", "fp")
    assert sorted(s["count"] for s in parse_counts(res.stdout)) == [50, 600]


def test_return_value_at_a_uretprobe(prog):
    """via_a returns take()'s running total + 1: 108, 225, 352 (weights.c:
    total += n + n/10 + 'a' - n)."""
    res = count(prog, "--weight", "retval", event=f"uretprobe:{prog}:via_a")
    assert [s["count"] for s in parse_counts(res.stdout)] == [685]


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_syscall_write_bytes_per_stack(prog, backend):
    """take writes n bytes: syscall:write's `count` sums 600 and 50, in bytes."""
    res = ok(run_ustack("count", "--backend", backend, "--weight", "count",
                        "syscall:write", "-c", f"{prog} write"))
    stacks = parse_counts(res.stdout)
    assert by_chain(stacks) == {"via_a": 600, "via_b": 50}
    assert {s["unit"] for s in stacks} == {"bytes (count)"}
    assert all(s["frames"][0] == ("write", "libc.so.6") for s in stacks)


def test_deferred_stacks_keep_their_weight(prog, tmp_path):
    """A program its command's words do not name has no unwind rows in the
    kernel when it starts: its stacks are deferred to ustack (capture/
    bpf_unwind.py), each record with its weight."""
    fresh = private_copy(prog, tmp_path)
    res = ok(run_ustack("count", "--backend", "bpf", "--weight", "count", "syscall:write",
                        "-c", f"sh -c 'P={fresh}; exec $P write'"))
    assert "unwound in the kernel" in res.stderr.splitlines()[0]
    assert by_chain(parse_counts(res.stdout), module=fresh.name) == \
        {"via_a": 600, "via_b": 50}


def test_syscall_write_bytes_on_tracefs(prog):
    """ftrace's userstacktrace stops in libc (no frame pointers): one stack
    holding all 650 bytes."""
    res = ok(run_ustack("count", "--backend", "tracefs", "--weight", "count",
                        "syscall:write", "-c", f"{prog} write"))
    assert [s["count"] for s in parse_counts(res.stdout)] == [650]


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_usdt_argument(backend):
    """usdt.c N: demo:twice fires with 1 from site_a and 2 from site_b, N
    times each; demo:one with -3*i (sum over i < N of -3i)."""
    if not Path("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists():
        pytest.skip("<sys/sdt.h> is missing (Debian's systemtap-sdt-dev)")
    usdt, n = build("usdt", flags=O2_NOFP), 4
    res = ok(run_ustack("count", "--backend", backend, "--weight", "arg0",
                        f"usdt:{usdt}:demo:twice", f"usdt:{usdt}:demo:one",
                        "-c", f"{usdt} {n}"))
    sums = {s["frames"][0][0]: s["count"] for s in parse_counts(res.stdout)}
    assert sums == {"site_a": n, "site_b": 2 * n, "step": -3 * sum(range(n))}


def test_formats_carry_the_sums(prog, tmp_path):
    """folded's values, json's counts and unit, pprof's sample type (read
    by go tool pprof) and speedscope's weights are the sums."""
    def run(fmt: str) -> Path:
        path = tmp_path / f"out.{fmt}"
        ok(run_ustack("count", "--weight", "count", "-f", fmt, "-o", path,
                      "syscall:write", "-c", f"{prog} write"))
        return path

    folded = {tuple(stack): n for stack, n in parse_folded(run("folded").read_text())}
    assert {stack[stack.index("main") + 1]: n for stack, n in folded.items()} == \
        {"via_a": 600, "via_b": 50}

    doc = json.loads(run("json").read_text())
    assert (doc["unit"], doc["weight"]) == ("bytes", "count")
    totals: dict = {}
    for s in doc["stacks"]:
        names = [f["function"] for f in s["frames"]]
        assert s["value"] == s["count"]
        caller = names[names.index("take") + 1]
        totals[caller] = totals.get(caller, 0) + s["count"]
    assert totals == {"via_a": 600, "via_b": 50}

    profile = run("pprof")
    assert top(profile)["take"] == ("0", "650B")
    sums: dict = {}
    for value, frames, _labels in traces(profile):     # "600B": bytes
        caller = frames[frames.index("take") + 1]
        sums[caller] = sums.get(caller, 0) + int(value.removesuffix("B"))
    assert sums == {"via_a": 600, "via_b": 50}

    scope = json.loads(run("speedscope").read_text())
    (only,) = scope["profiles"]
    assert (only["name"], only["unit"]) == ("syscall:write (bytes (count))", "bytes")
    assert sorted(only["weights"]) == [50, 600]


def test_python_api(prog):
    """Options(weight=…): each StackCount's count is the sum (of the
    stack at its addresses: main calls via_a from three unrolled sites)."""
    counted, _labels = run_counts("count", [f"uprobe:{prog}:take"], str(prog), weight="n")
    sums: dict = {}
    for sc in counted:
        names = [f.function for f in sc.stack.frames]
        caller = names[names.index("take") + 1]
        sums[caller] = sums.get(caller, 0) + sc.count
    assert sums == SUMS["n"]


def test_per_process_and_stack_storage(prog):
    """-P splits the sums by process; --stack-storage-size sizes the maps."""
    res = count(prog, "--weight", "n", "-P", "--stack-storage-size", "64")
    stacks = parse_counts(res.stdout)
    assert by_chain(stacks) == SUMS["n"]
    assert {s["comm"] for s in stacks} == {"weights"}


def test_attached_process(prog):
    target = spawn(prog, "-", stdin=subprocess.PIPE)
    res = ok(run_attached(target, "count", "--weight", "n", f"uprobe:{prog}:take"))
    assert by_chain(parse_counts(res.stdout)) == SUMS["n"]


@pytest.mark.parametrize("expr, event, message", [
    ("tag", "uprobe:{prog}:take", "--weight tag: it is a string in uprobe:{prog}:take, "
                                  "not a number to sum"),
    ("nope", "uprobe:{prog}:take", "take has no parameter 'nope'; its parameters: "
                                   "n, r, tag, delta"),
    ("arg1:string", "uprobe:{prog}:take", "--weight arg1:string: a string is not a "
                                          "number to sum"),
    ("$comm", "uprobe:{prog}:take", "--weight $comm: a string is not a number to sum"),
    ('\\"abc"', "uprobe:{prog}:take", '--weight \\"abc": a string is not a number to sum'),
    ("+0(%di):u8[4]", "uprobe:{prog}:take", "--weight +0(%di):u8[4]: an array is not "
                                            "one number to sum"),
    ("r->size", "uprobe:{prog}:take", "--weight r->size: not an argument ustack reads "
                                      "(a parameter name, argN, retval, or a fetch-arg "
                                      "such as '+8(%di):u32')"),
    ("n m", "uprobe:{prog}:take", "--weight takes one argument, not 'n m'"),
    ("retval", "uprobe:{prog}:take", "bad fetch-arg '$retval' in 'uprobe:{prog}:take': "
                                     "$retval exists only for uretprobe"),
    ("nope", "syscall:write", "--weight nope: syscall:write has no argument 'nope'; "
                              "its arguments: fd, buf, count"),
    ("buf", "syscall:openat", "--weight buf: syscall:openat has no argument 'buf'; "
                              "its arguments: dfd, filename, flags, mode"),
    ("n", "profile:hz:99", "--weight n: profile:hz:99 has no arguments to weigh by "
                           "(a timed sample)"),
])
def test_bad_expressions_fail_in_one_line(prog, tmp_path, expr, event, message):
    """Before any probe is placed: the command never runs (it would
    create the file)."""
    marker = tmp_path / "ran"
    res = run_ustack("count", "--weight", expr, event.format(prog=prog),
                     "-c", f"touch {marker}")
    assert fail_one_line(res) == "ustack: " + message.format(prog=prog)
    assert not marker.exists()


def test_not_recorded(prog, tmp_path):
    res = run_ustack("count", "--weight", "n", "--record", tmp_path / "r.ustack",
                     f"uprobe:{prog}:take", "-c", str(prog))
    assert fail_one_line(res) == ("ustack: --weight sums in the report of a live run: "
                                  "it is not recorded (drop --record)")
