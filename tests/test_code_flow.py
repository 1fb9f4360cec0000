"""Instruction starts are proven by following the code's control flow from
a trusted start, not by sweeping forward through whatever bytes follow it:
data placed in .text and jumped over (code_data's trick) no longer makes
the middle of an instruction look like a start, nor a true start like the
middle of one; and a CFI start moved into an instruction (code_data's
shifted, in a stripped copy) is not trusted. Every byte offset of both
functions is tried; the target's printed sum judges the accepted ones."""
from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers import build, events_lost, run_ustack

from ustack.model import UstackError
from ustack.probes.resolve import resolve_uprobes
from ustack.probes.spec import parse_event

BACKENDS = ("perf", "bpf", "tracefs")


def sh(*cmd) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                          text=True).stdout


def symbol(path, name: str) -> tuple:
    for line in sh("readelf", "-sW", path).splitlines():
        f = line.split()
        if len(f) == 8 and f[3] == "FUNC" and f[7] == name:
            return int(f[1], 16), int(f[2], 0)
    raise AssertionError(f"{path} has no function {name}")


def objdump_starts(path, lo: int, hi: int) -> list:
    """objdump's instruction addresses in [lo, hi), decoding from lo."""
    out = sh("objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{lo:x}",
             f"--stop-address=0x{hi:x}", path)
    return [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):", out, re.M)]


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    """code_data, its `strip -s` copy, and each function's true starts:
    trick's are its jmp and, decoded from the jmp's target trick+0x3, the
    rest (the byte between is data); shifted's decode from its symbol."""
    full = build("code_data", flags=("-O2",))
    stripped = tmp_path_factory.mktemp("code_data") / "code_data"
    sh("strip", "-s", "-o", stripped, full)
    trick, trick_size = symbol(full, "trick")
    shifted, shifted_size = symbol(full, "shifted")
    assert sh("objdump", "-d", f"--start-address=0x{trick:x}",
              f"--stop-address=0x{trick + 2:x}", full).count("jmp")
    return SimpleNamespace(
        full=full, stripped=stripped, output=sh(full),
        trick=range(trick, trick + trick_size),
        shifted=range(shifted, shifted + shifted_size),
        trick_starts=[trick] + objdump_starts(full, trick + 3, trick + trick_size),
        shifted_starts=objdump_starts(full, shifted, shifted + shifted_size))


def verdicts(path, addresses) -> tuple:
    """(accepted addresses, {refused address: error}) for a uprobe at each."""
    accepted, refused = [], {}
    for a in addresses:
        try:
            resolve_uprobes(parse_event(f"uprobe:{path}:0x{a:x}"))
        except UstackError as e:
            refused[a] = str(e)
        else:
            accepted.append(a)
    return accepted, refused


def test_data_in_code_in_a_stripped_copy(prog, capsys):
    """The CFI start trick is trusted (it agrees with the code before it);
    exactly its true starts are accepted: trick+0x3 too, trick+0x7 (inside
    the movabs) not."""
    accepted, refused = verdicts(prog.stripped, prog.trick)
    assert accepted == prog.trick_starts
    t = prog.trick.start
    assert t + 3 in accepted and t + 7 in refused
    assert refused[t + 7] == (
        f"0x{t + 7:x} in {prog.stripped} is not on an instruction boundary (inside "
        f"'movabs rax, 0xa' at 0x{t + 3:x}, decoding from the CFI start 0x{t:x})")
    assert re.fullmatch(               # the data byte: no path of the code runs it
        rf"uprobe:{re.escape(str(prog.stripped))}:0x{t + 2:x}: no path of the code "
        rf"from the CFI start 0x{t:x} reaches 0x{t + 2:x} .*; add --unsafe-address "
        "to probe it anyway", refused[t + 2])
    with capsys.disabled():
        print(f"\ntrick (stripped): {len(prog.trick)} offsets, {len(accepted)} accepted, "
              f"{len([a for a in accepted if a not in prog.trick_starts])} off a start")


def test_data_in_code_with_symbols(prog):
    accepted, _refused = verdicts(prog.full, prog.trick)
    assert accepted == prog.trick_starts
    accepted, _refused = verdicts(prog.full, prog.shifted)
    assert accepted == prog.shifted_starts


def test_a_cfi_start_inside_an_instruction(prog, capsys):
    """In the stripped copy shifted's only stated start is its FDE's, two
    bytes into its movabs: nothing of it is accepted, and the refusal says
    why (a decode from the end of trick's FDE runs into that movabs)."""
    s = prog.shifted.start
    accepted, refused = verdicts(prog.stripped, prog.shifted)
    assert accepted == []
    for a, error in refused.items():
        where = f"0x{a:x}"
        if a < s + 2:       # before the FDE: no start is known
            assert "no function start is known" in error, error
            continue
        assert error == (
            f"{where} in {prog.stripped} is not proven: the CFI start 0x{s + 2:x} is "
            f"not on an instruction boundary (inside 'movabs rax, 0x909090909090f801' "
            f"at 0x{s:x}, decoding from the end 0x{prog.trick.stop:x} of the function "
            "before it), so it is not trusted"), error
    # --unsafe-address does not override a start shown to be wrong
    with pytest.raises(UstackError, match="not trusted"):
        resolve_uprobes(parse_event(f"uprobe:{prog.stripped}:0x{s + 4:x}"), unsafe=True)
    with capsys.disabled():
        print(f"\nshifted (stripped): {len(prog.shifted)} offsets, 0 accepted")


def test_the_cases_of_a_switch_are_reached(prog):
    """pick's cases are reached only through its jump table: each of its
    instructions is accepted, in the stripped copy too; the padding nops
    between the cases (no path runs them) are not."""
    lo, size = symbol(prog.full, "pick")
    out = sh("objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{lo:x}",
             f"--stop-address=0x{lo + size:x}", prog.full)
    insns = [(int(a, 16), t) for a, t in re.findall(r"^\s+([0-9a-f]+):\s+(.*)$", out, re.M)]
    assert any(t.startswith("jmp") and "*" in t for _a, t in insns), out
    cases = [a for a, t in insns if not t.startswith(("nop", "cs nop", "data16"))]
    for path in (prog.full, prog.stripped):
        accepted, _refused = verdicts(path, range(lo, lo + size))
        assert accepted == cases, (path, out)


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_accepted_offsets_change_nothing(prog, backend):
    """Probes on every accepted offset of both functions, in the stripped
    copy and the full binary at once: the sum is the one printed unprobed,
    and every probe was hit 1000 times (with the hits a full buffer lost:
    the perf backend loses some when the machine is busy)."""
    for path in (prog.stripped, prog.full):
        accepted = verdicts(path, prog.trick)[0] + verdicts(path, prog.shifted)[0]
        events = [f"uprobe:{path}:0x{a:x}" for a in accepted]
        res = run_ustack("count", *events, "-c", path, "--backend", backend, timeout=180)
        assert res.returncode == 0, res.stderr
        assert prog.output in res.stdout, (res.stdout, res.stderr)
        hits = [int(n) for n in re.findall(r"^\s+(\d+)$", res.stdout, re.M)]
        assert sum(hits) + events_lost(res.stderr) == 1000 * len(accepted), (
            res.stdout, res.stderr)


@pytest.mark.kernel
def test_a_refusal_through_the_command(prog):
    t = prog.trick.start
    res = run_ustack("count", f"uprobe:{prog.stripped}:0x{t + 7:x}", "-c", prog.stripped)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == (
        f"ustack: 0x{t + 7:x} in {prog.stripped} is not on an instruction boundary "
        f"(inside 'movabs rax, 0xa' at 0x{t + 3:x}, decoding from the CFI start "
        f"0x{t:x})\n")
