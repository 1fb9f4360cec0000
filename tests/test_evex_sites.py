"""A uprobe on a VEX (AVX) or EVEX (AVX-512) instruction: the kernel judges
it by the opcode byte after the prefix, as if there were none, and either
refuses it (silently with -c: 0 hits) or steps it as another instruction
(EVEX vpbroadcast* taken for a conditional jump: the result is lost; a
uprobe on this machine's libc memset made it write zeros, under perf and
bpftrace alike). ustack refuses such a site before the run, with the next
instruction suggested; a glob skips it with a note. tests/programs/evex.c
has one function per encoding."""
from __future__ import annotations

import pytest

from helpers import build, ok, run_ustack

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def prog():
    return build("evex")


def test_an_evex_entry_is_refused_with_the_next_instruction(prog):
    res = run_ustack("count", f"uprobe:{prog}:f_evex", "-c", f"{prog} 1")
    assert res.returncode == 1
    assert res.stderr == (
        f"ustack: the kernel cannot place a uprobe at f_evex in {prog}: "
        "'vpbroadcastd xmm0, edi' is EVEX-encoded (AVX-512), which x86 uprobes "
        "take for another instruction (refused, or stepped wrongly); "
        "probe the next instruction, f_evex+0x6\n")


def avx512() -> bool:
    with open("/proc/cpuinfo") as f:
        return " avx512f" in f.read()


def output(res) -> tuple:
    """(what the program printed: its sum, funccount's table as a dict):
    the -c command shares ustack's stdout and ends before the table."""
    lines = res.stdout.splitlines()
    assert lines[1].split() == ["FUNC", "COUNT"], res.stdout
    return int(lines[0]), dict(line.split() for line in lines[2:])


def test_a_glob_probes_the_sse_site_and_skips_the_others(prog):
    """VEX too: the kernel refuses vmovd's site (with -c silently: it
    counted 0 before ustack refused it)."""
    res = ok(run_ustack("funccount", f"{prog}:f_*", "-c", f"{prog} 5"))
    assert output(res) == (5 * (1 + 2 + (3 if avx512() else 0)),
                           {"f_sse": "5"}), res.stdout
    for name, insn, kind in (("f_vex", "vmovd xmm0, edi", "VEX-encoded (AVX)"),
                             ("f_evex", "vpbroadcastd xmm0, edi", "EVEX-encoded (AVX-512)")):
        assert (f"ustack: skipped: the kernel cannot place a uprobe at {name} in {prog}: "
                f"'{insn}' is {kind}") in res.stderr, res.stderr


def test_the_next_instruction_is_probed(prog):
    """...and the program still computes what it computes untraced."""
    res = ok(run_ustack("funccount", f"{prog}:f_evex+0x6", "-c", f"{prog} 4"))
    expected = (4 * 6, {"f_evex": "4"}) if avx512() else (4 * 3, {"f_evex": "0"})
    assert output(res) == expected, res.stdout


def test_libc_memset_where_it_is_evex():
    """On an AVX-512 machine glibc runs __memset_avx512_unaligned_erms,
    whose first instruction is EVEX: `uprobe:libc:memset` says so."""
    res = run_ustack("count", "uprobe:libc:memset", "-c", "true")
    if "EVEX" not in res.stderr:
        pytest.skip(f"this machine's memset does not start with EVEX: {res.stderr[:200]}")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "probe the next instruction, __memset_" in res.stderr
