"""Return probes go only where calls land. gcc -O2 splits cold_part's
unlikely branch off into work.cold, reached by a jump from work after its
pushes: [sp] there holds a saved register, which a uretprobe would replace
(main's value kept across the call then prints wrong). Such a fragment is
refused for uretprobes and skipped by globs and latency, by its name or,
in a stripped copy, by its CFI; an entry uprobe on it is placed and said
to be on a fragment. The target's printed line judges every run."""
from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers import build, run_ustack

from ustack.model import UstackError
from ustack.probes.resolve import resolve_uprobes
from ustack.probes.spec import parse_event

BACKENDS = ("perf", "bpf", "tracefs")
FRAGMENT = ("work.cold is a part split off a function, reached by a jump, not "
            "called: [sp] holds no return address there")


def sh(*cmd) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                          text=True).stdout


def functions(path) -> dict:
    """{name: address} of the defined functions of path's .symtab."""
    out = {}
    for line in sh("readelf", "-sW", path).splitlines():
        f = line.split()
        if len(f) == 8 and f[3] == "FUNC" and f[6] != "UND" and int(f[1], 16):
            out[f[7]] = int(f[1], 16)
    return out


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    full = build("cold_part", flags=("-O2",))
    funcs = functions(full)
    if "work.cold" not in funcs:
        pytest.skip("this gcc did not split work.cold off work")
    stripped = tmp_path_factory.mktemp("cold_part") / "cold_part"
    sh("strip", "-s", "-o", stripped, full)
    return SimpleNamespace(full=full, stripped=stripped, funcs=funcs, output=sh(full))


def resolve(text: str, **kw):
    return resolve_uprobes(parse_event(text), **kw)


def test_a_uretprobe_on_the_fragment_is_refused(prog):
    with pytest.raises(UstackError) as e:
        resolve(f"uretprobe:{prog.full}:work.cold")
    assert str(e.value) == f"no uretprobe at work.cold in {prog.full}: {FRAGMENT}"
    cold = prog.funcs["work.cold"]
    with pytest.raises(UstackError) as e:
        resolve(f"uretprobe:{prog.stripped}:0x{cold:x}")
    assert re.fullmatch(
        rf"no uretprobe at 0x{cold:x} in {re.escape(str(prog.stripped))}: its CFI says "
        r"\[sp\] holds no return address there \(CFA rsp\+\d+ at its first row\): "
        "code that is jumped to, not called", str(e.value)), str(e.value)
    # the function itself, and the uprobe on the fragment, are fine
    probe, = resolve(f"uretprobe:{prog.full}:work")
    assert probe.address == prog.funcs["work"]
    probe, = resolve(f"uretprobe:{prog.stripped}:0x{prog.funcs['work']:x}")
    notes: list = []
    probe, = resolve(f"uprobe:{prog.full}:work.cold", notes=notes)
    assert probe.address == cold
    assert notes == [f"uprobe:{prog.full}:work.cold is a fragment of a function "
                     "(reached by a jump, not a call)"]


def test_a_glob_skips_the_fragment(prog):
    notes: list = []
    probes = resolve(f"uretprobe:{prog.full}:work*", notes=notes)
    assert [p.symbol for p in probes] == ["work"]
    assert notes == [f"skipped: no uretprobe at work.cold in {prog.full}: {FRAGMENT}"]


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_return_probes_on_every_function_change_nothing(prog, backend):
    """uretprobe:BIN:* (every function, work.cold among the matches) and
    the fragment's address in the stripped copy: the printed line is the
    unprobed one, and work's return was seen."""
    res = run_ustack("count", f"uretprobe:{prog.full}:*", "-c", prog.full,
                     "--backend", backend, timeout=120)
    assert res.returncode == 0, res.stderr
    assert prog.output in res.stdout, (res.stdout, res.stderr)
    assert f"skipped: no uretprobe at work.cold in {prog.full}: {FRAGMENT}" in res.stderr
    res = run_ustack("count", f"uretprobe:{prog.stripped}:0x{prog.funcs['work.cold']:x}",
                     "-c", prog.stripped, "--backend", backend)
    assert res.returncode == 1 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and "no uretprobe at" in res.stderr


@pytest.mark.kernel
def test_latency_over_a_glob(prog):
    """latency 'uprobe:BIN:work*' times work, not its fragment."""
    res = run_ustack("latency", f"uprobe:{prog.full}:work*", "-c", prog.full, timeout=120)
    assert res.returncode == 0, res.stderr
    assert prog.output in res.stdout, (res.stdout, res.stderr)
    assert re.search(rf"^uprobe:{re.escape(str(prog.full))}:work: count 1,", res.stdout,
                     re.M), res.stdout
    assert "not timed, not the start of a function: work.cold" in res.stderr
    res = run_ustack("latency", f"uprobe:{prog.full}:work.cold", "-c", prog.full)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == (f"ustack: uprobe:{prog.full}:work.cold cannot be timed: "
                          f"{FRAGMENT}\n")


@pytest.mark.kernel
def test_the_uretprobe_command_refuses_in_one_line(prog):
    res = run_ustack("trace", f"uretprobe:{prog.full}:work.cold", "-c", prog.full)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"ustack: no uretprobe at work.cold in {prog.full}: {FRAGMENT}\n"
