"""trace -f perf-script against the real `perf script`: the same program
and event (chain's raw write syscalls, frame pointers) recorded by
`perf record -g` and printed by `perf script` gives, event for event, the
same frame lines (addresses inside the objects, sym+off, object paths),
and perf's header lines re-made from their own fields by ustack's header
code are perf's lines exactly (every field's width and separator).
speedscope's perf-script importer (a reader of that text, as
FlameGraph's stackcollapse-perf.pl is) opens ustack's output and lists
the chain."""
from __future__ import annotations

import io
import re
import shutil
import subprocess

import pytest

from browser import chromium, keep_screenshot  # noqa: F401 (fixture)
from helpers import (CHAIN, FP, PERF_BUILD_IDS, build, open_in_speedscope, sandwich_rows,
                     trace_report)

from ustack.model import Frame, RawSample, Stack
from ustack.report.formats import EVENT_FORMATS
from ustack.report.perf_script import perf_header
from ustack.symbols.kernel import KERNEL_MODULE
from ustack.symbols.stacks import SEPARATOR

# the fields ustack's layout follows (perf script -F …)
PERF_FIELDS = "comm,pid,tid,cpu,time,period,event,ip,sym,symoff,dso"
# "chain 12779/12779 [000]  4038.348549:          1 syscalls:sys_enter_write: "
_HEADER = re.compile(r"^(?P<comm>\S.*?) +(?P<pid>\d+)/(?P<tid>\d+) +\[(?P<cpu>\d+)\] +"
                     r"(?P<secs>\d+)\.(?P<usecs>\d{6}): +(?P<period>\d+) (?P<event>\S+): $")
_FRAME = re.compile(r"^\t +[0-9a-f]+ \S.* \(\S+\)$")


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def events_of(text: str) -> list:
    """[(header line, [frame lines])] of perf script text; every line parses."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        header, *frames = block.strip("\n").split("\n")
        assert _HEADER.match(header), header
        assert all(_FRAME.match(f) for f in frames), frames
        out.append((header, frames))
    return out


def ustack_perf_script(chain, args: str) -> str:
    """`ustack trace -f perf-script syscall:write -c 'chain ARGS'`, through
    the events interface as trace drives it."""
    return trace_report("perf-script", ["syscall:write"], f"{chain} {args}",
                        unwind="fp")[0]


def real_perf_script(chain, args: str, tmp_path) -> str:
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed (the oracle of perf script's layout)")
    data = tmp_path / "perf.data"
    subprocess.run([perf, "record", "-q", "-B", *PERF_BUILD_IDS, "-e",
                    "syscalls:sys_enter_write", "--call-graph", "fp", "-o", str(data), "--", str(chain), *args.split()],
                   check=True, capture_output=True, timeout=60)
    return subprocess.run([perf, "script", "-i", str(data), "-F", PERF_FIELDS],
                          check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.mark.kernel
def test_same_layout_as_perf_script(chain, tmp_path):
    ours = events_of(ustack_perf_script(chain, "3 rawwrite"))
    theirs = events_of(real_perf_script(chain, "3 rawwrite", tmp_path))
    assert len(ours) == len(theirs) == 3
    for (our_header, our_frames), (header, frames) in zip(ours, theirs):
        assert our_frames[:len(frames)] == frames
        assert [re.search(r" (\w+)\+", f)[1] for f in our_frames[:len(CHAIN)]] == CHAIN
        m = _HEADER.match(header)
        remade = perf_header(m["comm"], int(m["pid"]), int(m["tid"]), int(m["cpu"]),
                             int(m["secs"]) * 10**9 + int(m["usecs"]) * 1000, m["event"])
        assert remade == header + "\n"
        ours_m = _HEADER.match(our_header)
        assert (ours_m["comm"], ours_m["period"], ours_m["event"]) == ("chain", "1", "syscall:write")


@pytest.mark.kernel
def test_read_by_speedscope(chain, tmp_path, chromium):  # noqa: F811 (fixture)
    path = tmp_path / "chain.perf-script"
    path.write_text(ustack_perf_script(chain, "4 rawwrite"))
    open_in_speedscope(chromium, path)
    rows = sandwich_rows(chromium)
    keep_screenshot(chromium, "speedscope-perf-script-sandwich")
    names = rows[2::3]                           # (total, self, name) a function
    assert names[0] == "d" and set(CHAIN) <= set(names)   # d: all the self time


def test_every_kind_of_frame():
    """Kernel frames first as ([kernel.kallsyms]), an inlined call as perf
    writes it, an unnamed frame, a frame outside any file; fetch-args after
    the event name; a command name with a space; addresses of objects that
    cannot be read stay the process's; unwinder notes left out."""
    out = io.StringIO()
    report = EVENT_FORMATS["perf-script"](out, ["uprobe:/gone/x:f"])
    stack = Stack((
        Frame(addr=0xffffffff81000130, module=KERNEL_MODULE, function="entry_SYSCALL_64",
              offset=0x30),
        SEPARATOR,
        Frame(addr=0x5000, module="x", function="inner", path="/gone/x", inlined=True),
        Frame(addr=0x5000, module="x", function="f", offset=0x10, path="/gone/x"),
        Frame(addr=0x6000, module="x", path="/gone/x"),
        Frame(addr=0x7000, module=""),
    ), notes=("not perf's",))
    sample = RawSample(probe=0, pid=12, tid=345678, time_ns=5_000_123_456, cpu=3,
                       args=(("n", "u64", 42),))
    report.add(sample, stack, lambda pid, tid, time_ns: "V8 Worker")
    report.flush()
    assert out.getvalue() == (
        "V8 Worker    12/345678 [003]     5.000123:          1 uprobe:/gone/x:f: n=42\n"
        "\tffffffff81000130 entry_SYSCALL_64+0x30 ([kernel.kallsyms])\n"
        "\t            5000 inner (inlined)\n"
        "\t            5000 f+0x10 (/gone/x)\n"
        "\t            6000 [unknown] (/gone/x)\n"
        "\t            7000 [unknown] ([unknown])\n"
        "\n")
