"""-f json (counted stacks) and trace's JSON Lines: the known chain's exact
frames (functions, the call sites' offsets from objdump, objects, runtime
addresses within the object's mapping) and exact counts."""
from __future__ import annotations

import io
import json

import pytest

from helpers import (CHAIN, FP, build, disassembly, return_offset, run_counts,
                     trace_report, write_report)

from ustack.model import Frame, RawSample, Stack
from ustack.report.formats import EVENT_FORMATS, ReportContext
from ustack.symbols.symbolizer import SymbolOptions


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def expected_offsets(chain) -> list:
    """d at its entry (the uprobe), then each caller at its return address."""
    dis = disassembly(chain)
    return [0] + [return_offset(dis, caller, callee)
                  for callee, caller in zip(CHAIN, CHAIN[1:])]


@pytest.mark.kernel
def test_counted_chain(chain, tmp_path):
    n = 23
    counted, labels = run_counts("count", [f"uprobe:{chain}:d", f"uprobe:{chain}:c"],
                                 f"{chain} {n}", symbols=SymbolOptions(lines=True))
    path = write_report("json", counted, tmp_path / "chain.json",
                        ReportContext(command="count", events=tuple(labels)))
    doc = json.loads(path.read_text())
    assert doc["format"] == "ustack-stacks" and doc["version"] == 1
    assert doc["events"] == labels and doc["unit"] == "count"
    assert [(s["event"], s["count"], s["value"]) for s in doc["stacks"]] == [
        (labels[0], n, n), (labels[1], 1, 1)]        # most frequent first
    d_stack = doc["stacks"][0]
    assert d_stack["comm"] == "chain" and d_stack["notes"] == []
    frames = d_stack["frames"][:len(CHAIN)]
    assert [f["function"] for f in frames] == CHAIN
    assert [f["offset"] for f in frames] == expected_offsets(chain)
    assert {(f["module"], f["path"], f["inlined"], f["kernel"]) for f in frames} == {
        ("chain", str(chain), False, False)}
    assert all(f["file"].endswith("chain.c") and f["line"] > 0 for f in frames)
    addrs = [int(f["address"], 16) for f in frames]
    assert len({a >> 12 for a in addrs}) == 1        # one page of code: the text mapping
    assert doc["stacks"][1]["frames"][0]["function"] == "c"


@pytest.mark.kernel
def test_events_json_lines(chain):
    """trace -f json: one object a line per event, through the events
    interface as trace drives it."""
    text, run = trace_report("json", [f"uprobe:{chain}:d"], f"{chain} 3")
    lines = text.splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    times = [r["time_ns"] for r in records]
    assert times == sorted(times)
    for r in records:
        assert r["pid"] == r["tid"] == run.target.pid
        assert r["comm"] == "chain" and r["event"] == f"uprobe:{chain}:d"
        assert r["args"] == {} and r["time"] == pytest.approx(r["time_ns"] / 1e9)
        assert [f["function"] for f in r["frames"]][:len(CHAIN)] == CHAIN
        assert [f["offset"] for f in r["frames"]][:len(CHAIN)] == expected_offsets(chain)


def test_events_json_args():
    """fetch-arg values as JSON: numbers, text (bytes not UTF-8 escaped),
    arrays as lists, null for a value the record was too short to hold."""
    out = io.StringIO()
    report = EVENT_FORMATS["json"](out, ["uprobe:/bin/x:f"])
    sample = RawSample(probe=0, pid=7, tid=8, time_ns=1_500_000_000, cpu=1,
                       args=(("n", "s64", -3), ("s", "string", b"hi\xff"),
                             ("a", "hex", (1, 2)), ("gone", "u32", None)))
    stack = Stack((Frame(addr=0x401000, module="x", function="f", path="/bin/x"),))
    report.add(sample, stack, lambda pid, tid, time_ns: "x y")
    report.flush()
    [record] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert record["args"] == {"n": -3, "s": "hi\\xff", "a": [1, 2], "gone": None}
    assert (record["comm"], record["pid"], record["tid"], record["cpu"]) == ("x y", 7, 8, 1)
    assert record["time"] == 1.5 and record["frames"][0]["address"] == "0x401000"
