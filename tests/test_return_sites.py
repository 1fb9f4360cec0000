"""probes/return_sites.py against objdump: a function's RET instructions
and tail-call jumps, and where a Go function's call begins (after its
stack-growth check, which runs again after runtime.morestack)."""
from __future__ import annotations

import re

from helpers import O2_NOFP, build, build_go, disassembly

from ustack.objfile.elf import ElfImage
from ustack.probes.return_sites import entry_site, return_sites


def sites(path, func):
    image = ElfImage.open(str(path))
    (sym,) = image.find(func)
    return image, sym, return_sites(image, sym)


def test_c_rets_and_tail_jump():
    prog = build("latency", flags=O2_NOFP)
    insns = disassembly(prog)["tail_nap"]
    _image, _sym, found = sites(prog, "tail_nap")
    assert list(found.rets) == [a for a, t in insns if t.startswith("ret")]
    assert list(found.tail_jumps) == [a for a, t in insns
                                      if re.match(r"jmp\s+[0-9a-f]+ <nap>$", t)]
    _image, _sym, found = sites(prog, "rec_nap")     # two RETs, no tail call
    assert len(found.rets) == 2 and not found.tail_jumps


def test_go_rets_and_entry_after_the_stack_check():
    gobin = build_go("golatency")
    dis = disassembly(gobin)
    for func in ("main.work", "main.grow"):     # big frame (r12 check), small frame
        insns = dis[func]
        image, sym, found = sites(gobin, func)
        assert list(found.rets) == [a for a, t in insns if t.startswith("ret")]
        assert not found.tail_jumps
        # the first instruction after the conditional jumps to morestack
        checks = [i for i, (_a, t) in enumerate(insns[:6]) if re.match(r"j(be|b)\s", t)]
        assert checks, insns[:6]
        assert entry_site(image, sym) == insns[checks[-1] + 1][0]
        # the morestack block jumps back to the first instruction, not there
        assert any(t.endswith(f"<{func}>") and t.startswith("jmp") for _a, t in insns)
