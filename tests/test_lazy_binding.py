"""Stacks through ld.so's lazy-binding resolver (_dl_runtime_resolve_*),
whose CFA is rbx-based (DW_CFA_def_cfa_register rbx): a program built
-z lazy makes first calls through its PLT, and a uprobe in ld.so's
_dl_fixup (the resolver's callee: rbx is the sampled one) or deeper in
_dl_lookup_symbol_x (rbx as _dl_fixup saved it) stops inside. The walk must
follow that frame to _start, as gdb does, on both backends; where rbx is
not known the stack is cut with a note that says so, never a guessed frame."""
from __future__ import annotations

import pytest

from helpers import O2_NOFP, build, gdb_capture, ok, parse_counts, run_ustack
from ustack.unwind.dwarf import BX_UNKNOWN_NOTE, DwarfUnwinder

pytestmark = pytest.mark.kernel

LDSO = "/lib64/ld-linux-x86-64.so.2"
RESOLVER = "_dl_runtime_resolve_xsavec"   # the one this machine's CPU (xsavec) gets
# first_call's own first call through the PLT, from the resolver's callees in
PROBES = ["_dl_fixup", "_dl_lookup_symbol_x"]


@pytest.fixture(scope="module")
def prog():
    return build("lazy_bind", flags=O2_NOFP + ("-Wl,-z,lazy",))


@pytest.fixture(autouse=True)
def cfi_cache(tmp_path_factory, monkeypatch):
    """Unwind tables of these tests go to a scratch cache, not ~/.cache."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("LD_BIND_NOW", raising=False)


@pytest.mark.parametrize("probe", PROBES)
def test_copy_unwinder_follows_the_resolver_like_gdb(prog, probe, tmp_path):
    cap = gdb_capture(prog, ["0"], f"first_call;{probe}", tmp_path)
    assert cap.gdb_names[cap.gdb_names.index(RESOLVER) + 1] == "first_call"
    addrs, notes = DwarfUnwinder().unwind(cap.regs, cap.stack, cap.find_mapping)
    assert [hex(a) for a in addrs] == [hex(p) for p in cap.gdb_pcs]
    assert notes == ()


def test_resolver_frame_without_rbx_is_cut_with_a_note(prog, tmp_path):
    """No rbx sampled (a capture that does not take it), and nothing between
    restores it: the walk ends at the resolver, and says why."""
    cap = gdb_capture(prog, ["0"], "first_call;_dl_fixup", tmp_path)
    regs = {k: v for k, v in cap.regs.items() if k != "bx"}
    addrs, notes = DwarfUnwinder().unwind(regs, cap.stack, cap.find_mapping)
    assert [hex(a) for a in addrs] == [hex(p) for p in cap.gdb_pcs[:2]]
    assert notes == (BX_UNKNOWN_NOTE,)


def counted(backend: str, probe: str, prog) -> list[dict]:
    res = ok(run_ustack("count", "--unwind", "dwarf", "--backend", backend,
                        f"uprobe:{LDSO}:{probe}", "-c", f"{prog} 0"))
    return parse_counts(res.stdout)


@pytest.mark.parametrize("backend", ["bpf", "perf"])
@pytest.mark.parametrize("probe", PROBES)
def test_stacks_through_the_resolver_are_whole(prog, backend, probe, tmp_path):
    """Every stack through the resolver (the program's start-up's first
    calls too) goes on to _start with no note; first_call's is gdb's."""
    stacks = counted(backend, probe, prog)
    through = [[f for f, _m in s["frames"]] for s in stacks
               if any(f == RESOLVER for f, _m in s["frames"])]
    assert len(through) >= 2, stacks            # first_call's and puts's at least
    for frames in through:
        assert frames[-1] == "_start", frames   # whole: no note, no cut
    gdb = gdb_capture(prog, ["0"], f"first_call;{probe}", tmp_path).gdb_names
    mine = [s for s in stacks if any(f == "first_call" for f, _m in s["frames"])]
    assert [s["count"] for s in mine] == [1]
    frames = [f for f, _m in mine[0]["frames"]]
    # to main as gdb names them (libc's start-up: gdb says __libc_start_main_impl)
    assert frames[:frames.index("main") + 1] == gdb[:gdb.index("main") + 1]
