"""memleak and realloc(NULL, n): glibc's realloc jumps into malloc at the
same sp, its return address already replaced by realloc's uretprobe; the
call counted is realloc's, with the stack walked at its entry (whole),
not malloc's, whose walk would start at the trampoline."""
from __future__ import annotations

import subprocess

import pytest

from helpers import O2_NOFP, build, ok, run_ustack
from test_memleak import START, parse_reports

pytestmark = pytest.mark.kernel


def test_realloc_of_null_is_counted_with_its_whole_stack():
    prog = build("realloc_null", flags=O2_NOFP)
    res = ok(run_ustack("memleak", "-c", str(prog), stdin=subprocess.DEVNULL))
    (report,) = parse_reports(res.stdout)
    mine = [(frames, nbytes, blocks) for frames, nbytes, blocks in report
            if "grow_inner" in frames]
    assert mine == [(("realloc", "grow_inner", "grow_outer", *START), 5 * 1234, 5)]
