"""trace --backend bpf: a stack per event, unwound in the kernel with
DWARF rules and written to a BPF ring buffer (nothing else leaves the
kernel): the same events, frames and offsets as the copy path's trace."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import O2_NOFP, build, ok, parse_trace, run_ustack

pytestmark = pytest.mark.kernel

IN_KERNEL = "[backend bpf, unwind dwarf; unwound in the kernel]"
CHAIN = ["d", "c", "b", "a", "main"]


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=O2_NOFP)


def traced(backend: str, *args) -> list[dict]:
    res = ok(run_ustack("trace", "--unwind", "dwarf", "--backend", backend, *args))
    assert (IN_KERNEL if backend == "bpf" else "[backend perf, unwind dwarf]") in \
        res.stderr.splitlines()[0]
    assert "Lost" not in res.stderr and "cut short" not in res.stderr, res.stderr
    return parse_trace(res.stdout)


def frames(record: dict) -> list[tuple]:
    return [(f["func"], f["off"], f["module"]) for f in record["frames"]]


@pytest.mark.parametrize("event", ["uprobe", "syscall"])
def test_trace_same_stacks_as_the_copy_path(chain, event):
    n = 5
    if event == "uprobe":
        args = (f"uprobe:{chain}:d", "-c", f"{chain} {n}")
    else:
        args = ("syscall:write", "-c", f"{chain} {n} write")
    kernel = traced("bpf", *args)
    copied = traced("perf", *args)
    assert len(kernel) == len(copied) == n
    for k, c in zip(kernel, copied):
        assert frames(k) == frames(c), (k, c)
    names = [f[0] for f in frames(kernel[0])]
    assert names[names.index("d"):names.index("d") + 5] == CHAIN
    times = [r["time"] for r in kernel]
    assert times == sorted(times) and times[0] > 0     # CLOCK_MONOTONIC, as perf
    assert {r["pid"] for r in kernel} == {kernel[0]["pid"]}


def test_trace_refuses_what_the_ring_cannot_carry(chain):
    """Fetch-args go into the ring with the frames (capture/bpf_fetchargs.py);
    one BPF does not fetch is refused in one line, naming it."""
    res = ok(run_ustack("trace", "--backend", "bpf", f"uprobe:{chain}:d n=%di:s64",
                        "-c", f"{chain} 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    assert [r["label"].split()[1] for r in parse_trace(res.stdout)] == ["n=0", "n=1"]
    res = run_ustack("trace", "--backend", "bpf", f"uprobe:{chain}:d n=+0(%sp):string[2]",
                     "-c", f"{chain} 1")
    assert res.returncode != 0
    assert res.stderr.strip() == ("ustack: trace --backend bpf cannot fetch "
                                  "n=+0(%sp):string[2] (arrays of strings are fetched "
                                  "by the perf backend only); use --backend perf")


def test_auto_traces_through_the_kernel_with_arguments_it_fetches(chain):
    """--unwind auto picks the in-kernel path for a stream too, wherever
    frame pointers are not enough, fetch-args included where the BPF
    program fetches them as the kernel's uprobes do, a string in user
    memory too (test_bpf_trace_args)."""
    res = ok(run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    names = [f[0] for f in frames(parse_trace(res.stdout)[0])]
    assert names[:5] == CHAIN
    res = ok(run_ustack("trace", f"uprobe:{chain}:d n=%di:s64", "-c", f"{chain} 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    records = parse_trace(res.stdout)
    assert len(records) == 2 and all(" n=" in r["label"] for r in records), res.stdout
    res = ok(run_ustack("trace", f"uprobe:{chain}:d s=+0(%sp):string", "-c", f"{chain} 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0]


def test_auto_traces_a_commands_children_in_the_kernel():
    """A -c command's syscalls, its children's included: the in-kernel
    programs follow every process the command forks (task_newtask), as the
    copy path's inherited perf events do; each stack whole, through libc."""
    chain = build("chain", flags=O2_NOFP)
    res = ok(run_ustack("trace", "syscall:write", "-c",
                        f"sh -c '{chain} 2 write; {chain} 1 write'"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    records = [r for r in parse_trace(res.stdout) if r["comm"] == "chain"]
    assert len(records) == 3, res.stdout
    assert len({r["pid"] for r in records}) == 2
    for r in records:
        names = [f[0] for f in frames(r)]
        assert names[:6] == ["write"] + CHAIN, names
