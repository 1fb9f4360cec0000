"""Frames of code that no symbol names keep their place in the object: a
fully stripped program's functions are `fn@0x11e0+0x16 [prog]` (the start
its CFI gives) or, without CFI, `0x11f6 [prog]` (the pc in the object), in
every output format, and two unnamed functions are never one frame.

The oracle is the same program before `strip -s`: nm's address of each of
main -> a -> b -> c -> d is the start the stripped copy's frames must name."""
from __future__ import annotations

import json
import subprocess

import pytest

from helpers import (CHAIN, O2_FP, O2_NOFP, build, nm_symbols, ok, parse_folded,
                     parse_trace, raw, run_ustack, top)
from test_formats_pprof import elf_address

pytestmark = pytest.mark.kernel


def stripped(full, tmp_path, *remove) -> str:
    path = tmp_path / "chain"
    args = [f for section in remove for f in ("-R", section)]
    subprocess.run(["strip", "-s", *args, "-o", str(path), str(full)], check=True)
    return str(path)


@pytest.fixture(scope="module")
def full():
    return build("chain", flags=O2_NOFP)


def starts_of(full) -> list:
    """nm's start of d, c, b, a, main: innermost first, as stacks print."""
    syms = nm_symbols(full)
    return [syms[name][0] for name in CHAIN]


def chain_frames(record) -> list:
    return [f for f in record["frames"] if f["module"] == "chain"]


def test_stripped_functions_are_named_by_their_cfi_start(full, tmp_path):
    prog = stripped(full, tmp_path)
    res = ok(run_ustack("trace", "syscall:write", "-c", f"{prog} 2 write"))
    records = [r for r in parse_trace(res.stdout) if r["comm"] == "chain"]
    assert len(records) == 2, res.stdout
    want = [f"fn@0x{a:x}" for a in starts_of(full)]
    for r in records:
        ours = chain_frames(r)
        assert [f["func"] for f in ours][:5] == want, res.stdout
        # each offset is the pc's distance from that start, inside the function
        syms = nm_symbols(full)
        for f, name in zip(ours, CHAIN):
            assert 0 < f["off"] < syms[name][1], (name, f)


def test_every_format_keeps_unnamed_functions_apart(full, tmp_path):
    prog = stripped(full, tmp_path)
    want = [f"fn@0x{a:x}" for a in starts_of(full)]

    folded = ok(run_ustack("count", "syscall:write", "-f", "folded",
                           "-c", f"{prog} 3 write")).stdout
    [(frames, n)] = [(f, n) for f, n in parse_folded(folded) if f[0] == "chain"]
    assert n == 3
    ours = [f for f in frames if f.endswith("_[chain]")]
    assert ours[-5:] == [f"{w}_[chain]" for w in reversed(want)], folded

    out = tmp_path / "s.json"
    ok(run_ustack("count", "syscall:write", "-f", "json", "-o", str(out),
                  "-c", f"{prog} 3 write"))
    [stack] = [s for s in json.loads(out.read_text())["stacks"] if s["comm"] == "chain"]
    mine = [f for f in stack["frames"] if f["module"] == "chain"]
    assert [f["function"] for f in mine][:5] == [None] * 5
    assert [f["code_start"] for f in mine][:5] == [f"0x{a:x}" for a in starts_of(full)]
    assert all(int(f["object_address"], 16) > int(f["code_start"], 16) for f in mine)

    for page in ("s.html", "s.svg"):                # the flame graphs' frames
        out = tmp_path / page
        ok(run_ustack("count", "syscall:write", "-o", str(out), "-c", f"{prog} 3 write"))
        text = out.read_text()
        assert all(f"{w} [chain]" in text for w in want), page

    out = tmp_path / "s.speedscope.json"
    ok(run_ustack("count", "syscall:write", "-f", "speedscope", "-o", str(out),
                  "-c", f"{prog} 3 write"))
    names = {f["name"] for f in json.loads(out.read_text())["shared"]["frames"]}
    assert {f"{w} [chain]" for w in want} <= names, names


def test_pprof_locations_have_their_mapping(full, tmp_path):
    """go tool pprof lists each unnamed function apart, and the
    mapping puts each at its place in the object, so pprof (or anyone with
    the unstripped file) can name it later."""
    prog = stripped(full, tmp_path)
    out = tmp_path / "s.pb.gz"
    ok(run_ustack("count", "uprobe:" + prog + ":0x%x" % starts_of(full)[0],
                  "-f", "pprof", "-o", str(out), "-c", f"{prog} 5"))
    r = raw(out)
    [(mid, mapping)] = [(i, m) for i, m in r["mappings"].items()
                        if m[3].endswith("/chain")]
    ours = [addr for addr, m, lines in r["locations"].values() if m == mid]
    in_object = sorted(elf_address(full, mapping, a) for a in ours)
    starts = sorted(starts_of(full))
    # every location of the program lies in one of its functions, and the
    # five of the call chain are five distinct locations
    syms = nm_symbols(full)
    owners = {next((n for n, (s, size) in syms.items() if s <= a < s + size), None)
              for a in in_object}
    assert set(CHAIN) <= owners, (owners, [hex(a) for a in in_object], starts)
    listed = top(out)
    assert {f"fn@0x{a:x} [chain]" for a in starts} <= set(listed), listed
    assert listed[f"fn@0x{starts_of(full)[0]:x} [chain]"] == ("5", "5")


def test_without_cfi_each_frame_keeps_its_address(tmp_path):
    """No symbols and no CFI (frame pointers walk it): the pc in the
    object, `0x11f6 [prog]`, one frame per call site, each inside the
    function nm gives for the unstripped build."""
    full = build("chain", flags=O2_FP)
    prog = stripped(full, tmp_path, ".eh_frame", ".eh_frame_hdr")
    res = ok(run_ustack("trace", "syscall:write", "--unwind", "fp",
                        "-c", f"{prog} 1 rawwrite"))
    [r] = [r for r in parse_trace(res.stdout) if r["comm"] == "chain"]
    syms = nm_symbols(full)
    addrs = [int(f["func"], 16) for f in chain_frames(r) if f["func"].startswith("0x")]
    owners = [next((n for n, (s, size) in syms.items() if s <= a < s + size), None)
              for a in addrs]
    assert owners[:5] == CHAIN, (owners, res.stdout)
