"""Globs of thousands of uprobes behind uprobe_multi links
(capture/uprobe_links.py): count, trace and latency keep each probe's
identity (the link's cookie) and the process scope, and the runs end
within the tests' timeouts (on a perf event per uprobe, set-up and
teardown of ~2,000 uprobes took minutes).

tests/programs/many_funcs.c has 1,024 functions fn_00000..fn_33333, each
called once, and fn_00013 N more times."""
from __future__ import annotations

import re
import subprocess
from collections import Counter

import pytest

from helpers import (build, ok, parse_counts, parse_trace, private_copy, run_attached_beside,
                     run_ustack)

from ustack.capture.bpf_funccount import uprobe_multi_supported

pytestmark = [pytest.mark.kernel, pytest.mark.skipif(
    not uprobe_multi_supported(), reason="this kernel makes no uprobe_multi links (before 6.6)")]

FUNCS = 1024
AGAIN = "fn_00013"                   # the function called N more times


def events_in(header: str) -> int:
    m = re.search(r"… \((\d+) events\)", header)
    assert m, header
    return int(m[1])


def leaf_counts(out: str) -> Counter:
    """Calls per innermost function, summed over its stacks."""
    calls: Counter = Counter()
    for stack in parse_counts(out):
        calls[stack["frames"][0][0]] += stack["count"]
    return calls


def expected(n: int) -> Counter:
    calls = Counter({f"fn_{i // 256}{i // 64 % 4}{i // 16 % 4}{i // 4 % 4}{i % 4}": 1
                     for i in range(FUNCS)})
    calls[AGAIN] += n
    return calls


def test_count_of_libc_counts_a_known_function_exactly():
    """Every function of libc (~2,000 uprobes) on a -c command: write's
    25 calls counted, each through d's stack, and the run ends within the
    timeout."""
    prog = build("chain")
    res = ok(run_ustack("count", "uprobe:libc:*", "-c", f"{prog} 25 write", timeout=90))
    assert events_in(res.stderr) >= 1000, res.stderr.splitlines()[0]
    writes = [s for s in parse_counts(res.stdout) if s["frames"][0][0] == "write"]
    assert sum(s["count"] for s in writes) == 25, res.stdout
    assert all([f for f, _m in s["frames"][1:6]] == ["d", "c", "b", "a", "main"]
               for s in writes), writes


def test_count_of_a_glob_counts_each_function_exactly(tmp_path):
    prog = private_copy(build("many_funcs"), tmp_path)
    res = ok(run_ustack("count", f"uprobe:{prog}:fn_*", "-c", f"{prog} 5"))
    assert events_in(res.stderr) == FUNCS, res.stderr.splitlines()[0]
    assert leaf_counts(res.stdout) == expected(5)
    # what the links leave out is said where the run starts
    assert (f"its {FUNCS} uprobes (uprobe_multi links) fire in the traced process, "
            "not in processes it forks") in res.stderr.splitlines()[0]


def test_trace_of_a_glob_keeps_each_events_label(tmp_path):
    """Each event is labelled with the function it stopped in, which is
    its stack's innermost frame."""
    prog = private_copy(build("many_funcs"), tmp_path)
    res = ok(run_ustack("trace", f"uprobe:{prog}:fn_*", "-c", f"{prog} 2"))
    events = parse_trace(res.stdout)
    labels = Counter(e["label"].rsplit(":", 1)[1] for e in events)
    assert labels == expected(2)
    assert all(e["label"] == f"uprobe:{prog}:{e['frames'][0]['func']}" for e in events), \
        [e for e in events if not e["label"].endswith(e["frames"][0]["func"])][:3]


def test_pid_scope_leaves_out_another_copy(tmp_path):
    """-p PID over a glob: that process's calls only, none of another
    process running the same binary at the same time."""
    prog = private_copy(build("many_funcs"), tmp_path)
    go = dict(stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    res = run_attached_beside(subprocess.Popen([str(prog), "3", "-"], **go),
                              subprocess.Popen([str(prog), "7", "-"], **go),
                              "count", f"uprobe:{prog}:fn_*")
    assert res.returncode == 0, res.stderr
    assert events_in(res.stderr) == FUNCS, res.stderr
    out = res.stdout
    assert leaf_counts(out) == expected(3)


def test_latency_over_a_glob(tmp_path):
    """A histogram per function, each with its exact number of calls."""
    prog = private_copy(build("many_funcs"), tmp_path)
    res = ok(run_ustack("latency", f"uprobe:{prog}:fn_*", "-c", f"{prog} 5"))
    counts = dict(re.findall(rf"^uprobe:{re.escape(str(prog))}:(\w+): count (\d+),",
                             res.stdout, re.M))
    assert Counter({f: int(n) for f, n in counts.items()}) == expected(5), res.stdout


def test_count_by_frame_pointers_over_a_glob(tmp_path):
    """--unwind fp behind links: each function's count, and the caller
    the frame-pointer walk skips at an entry (its return address, read
    per probe) still under it. 16 functions and a large storage: the
    kernel's stack ids of so few stacks do not collide."""
    prog = private_copy(build("many_funcs"), tmp_path)
    res = ok(run_ustack("count", "--unwind", "fp", "--stack-storage-size", "65536",
                        f"uprobe:{prog}:fn_000*", "-c", f"{prog} 5"))
    assert events_in(res.stderr) == 16, res.stderr.splitlines()[0]
    want = Counter({name: n for name, n in expected(5).items() if name.startswith("fn_000")})
    assert leaf_counts(res.stdout) == want
    for stack in parse_counts(res.stdout):
        assert [f for f, _m in stack["frames"][:2]] == [stack["frames"][0][0], "main"], stack
