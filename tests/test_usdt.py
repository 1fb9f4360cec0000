"""USDT probes (usdt:PATH:PROVIDER:NAME) on a program built with <sys/sdt.h>
(tests/programs/usdt.c): exact hits and stacks on every backend, the
semaphore raised only while traced, and arguments equal to the program's
values and to bpftrace's `usdt:` on the same probes."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import FP, O2_NOFP, build, run_ustack
from helpers import label_values
from helpers import fail_one_line, funcs, ok, parse_counts, parse_trace, program_frames

pytestmark = pytest.mark.kernel

N = 5
NAMES = ("alpha", "beta", "gamma")


def expected(i: int) -> dict:
    """What step(i) passes to each probe (see usdt.c)."""
    return {"one": [-3 * i],
            "two": [200 + i, i * 1000000007 - 3],
            "three": [-100 - i, 0xffffffff00000000 + i, NAMES[i % 3]],
            "konst": [-5, i],
            "global": [1000 + N, 20, "delta"]}


@pytest.fixture(scope="module", params=[O2_NOFP, FP], ids=["o2-nofp", "o0-fp"])
def prog(request) -> Path:
    if not Path("/usr/include/x86_64-linux-gnu/sys/sdt.h").exists():
        pytest.skip("<sys/sdt.h> is missing (Debian's systemtap-sdt-dev)")
    return build("usdt", flags=request.param)


def enabled(out: Path) -> int:
    return int(out.read_text().strip().partition("=")[2])


@pytest.mark.parametrize("backend", ["bpf", "perf", "tracefs"])
def test_hits_stacks_and_semaphore(prog, backend, tmp_path):
    out = tmp_path / "enabled"
    res = ok(run_ustack("count", "--backend", backend, f"usdt:{prog}:demo:guarded",
                        "-c", f"{prog} {N} {out}"))
    stacks = parse_counts(res.stdout)
    assert [s["count"] for s in stacks] == [N], res.stdout
    names, mods = funcs(stacks[0]["frames"]), [m for _, m in stacks[0]["frames"]]
    assert program_frames(names, mods, module="usdt") == ["step", "work", "main"]
    assert enabled(out) == N        # the is-enabled test held on every traced call
    # usdt:PATH:NAME, and a probe with two sites: both are attached
    res = ok(run_ustack("count", "--backend", backend, f"usdt:{prog}:twice",
                        "-c", f"{prog} {N} {out}"))
    got = sorted((tuple(program_frames(funcs(s["frames"]), [m for _, m in s["frames"]],
                                       module="usdt")), s["count"])
                 for s in parse_counts(res.stdout))
    assert got == [(("site_a", "step", "work", "main"), N),
                   (("site_b", "step", "work", "main"), N)]
    # untraced, the semaphore is 0 again: the guarded probe's test never holds
    subprocess.run([str(prog), str(N), str(out)], check=True)
    assert enabled(out) == 0


def _events(prog) -> list:
    return [f"usdt:{prog}:demo:one arg0", f"usdt:{prog}:demo:two arg0 arg1",
            f"usdt:{prog}:demo:three arg0 arg1 arg2:string", f"usdt:{prog}:konst arg0 arg1",
            f"usdt:{prog}:demo:global arg0 arg1 arg2:string"]


def _traced_args(prog, backend, tmp_path) -> list:
    res = ok(run_ustack("trace", "--backend", backend, *_events(prog),
                        "-c", f"{prog} {N} {tmp_path / 'out'}"))
    rows = []
    for r in parse_trace(res.stdout):
        name = r["label"].split()[0].rsplit(":", 1)[1]
        vals = [v.strip('"') for v in label_values(r["label"]).values()]
        rows.append((name, [v if name in ("three", "global") and k == 2 else int(v)
                            for k, v in enumerate(vals)]))
        assert funcs(r["frames"])[:3] == ["step", "work", "main"], r
    return rows


def _bpftrace_args(prog, tmp_path) -> list:
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed (the oracle of USDT arguments)")
    script = (f'usdt:{prog}:demo:one {{ printf("one %d\\n", arg0); }}\n'
              f'usdt:{prog}:demo:two {{ printf("two %d %ld\\n", arg0, arg1); }}\n'
              f'usdt:{prog}:demo:three {{ printf("three %d %lu %s\\n", arg0, arg1, '
              f'str(arg2)); }}\n'
              f'usdt:{prog}:demo:konst {{ printf("konst %d %ld\\n", arg0, arg1); }}\n')
    res = subprocess.run(["bpftrace", "-e", script, "-c", f"{prog} {N} {tmp_path / 'bt'}"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    rows = []
    for line in res.stdout.splitlines():
        name, *vals = line.split() or [""]
        if name in ("one", "two", "three", "konst"):
            rows.append((name, [v if name == "three" and k == 2 else int(v)
                                for k, v in enumerate(vals)]))
    return rows


@pytest.mark.parametrize("backend", ["perf", "tracefs", "bpf"])
def test_arguments_equal_the_program_and_bpftrace(prog, backend, tmp_path):
    want = [(name, vals) for i in range(N) for name, vals in expected(i).items()]
    got = _traced_args(prog, backend, tmp_path)
    assert got == want
    if backend == "perf":       # bpftrace 0.17 cannot read globals (gbase(%rip))
        assert _bpftrace_args(prog, tmp_path) == [r for r in want if r[0] != "global"]


def test_unknown_probe_and_binary_without_notes(prog):
    msg = fail_one_line(run_ustack("count", f"usdt:{prog}:demo:gaurded", "-c", str(prog)))
    assert msg == (f"ustack: no USDT probe 'demo:gaurded' in {prog}; "
                   "did you mean: demo:guarded?")
    msg = fail_one_line(run_ustack("trace", f"usdt:{prog}:demo:one arg1", "-c", str(prog)))
    assert msg == "ustack: USDT probe demo:one has no argument arg1; its argument: arg0"
    chain = build("chain", flags=FP)
    msg = fail_one_line(run_ustack("count", f"usdt:{chain}:x", "-c", str(chain)))
    assert msg == f"ustack: {chain} has no USDT probes (no .note.stapsdt section)"


def _spec(prog, name: str) -> str:
    out = subprocess.run(["readelf", "-n", str(prog)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    at = [i for i, line in enumerate(out) if line.strip() == f"Name: {name}"][0]
    return out[at + 2].split("Arguments:")[1].strip()


def test_list_shows_the_probes_with_their_arguments(prog):
    res = run_ustack("list", str(prog))
    assert res.returncode == 0, res.stderr
    functions, _, usdt = res.stdout.partition("\n\nUSDT PROBE")
    assert " step\n" in functions + "\n"
    rows = {line.split()[0]: line.split()[1:] for line in usdt.splitlines()[1:]}
    assert rows["demo:twice"][0] == "2" and rows["demo:zero"] == ["1"]
    assert rows["demo:three"][1:] == _spec(prog, "three").split()
    res = run_ustack("list", str(prog), "usdt:gu*")
    assert res.stdout.splitlines()[1:] == [f"demo:guarded      1  {_spec(prog, 'guarded')}"]


PYTHON = "/usr/bin/python3.11"
# function__entry fires in 3.11 where a profiler or tracer is set (and on a
# generator's throw()): foo's 7 calls under the profiler, not the 5 after
PROFILED = """import sys
def foo(x): return x
def profiler(frame, event, arg): pass
sys.setprofile(profiler)
for i in range(7): foo(i)
sys.setprofile(None)
for i in range(5): foo(i)
"""


def _python_calls_bpftrace(script: Path) -> dict:
    bt = ('usdt:%s:python:function__entry { @[str(arg0), str(arg1)] = count(); }'
          % PYTHON)
    env = dict(os.environ, BPFTRACE_STRLEN="120", BPFTRACE_MAX_STRLEN="120")  # the path
    res = subprocess.run(["bpftrace", "-e", bt, "-c", f"{PYTHON} {script}"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr
    return {(f, n): int(c) for f, n, c in
            re.findall(r"^@\[(.*), (.*)\]: (\d+)$", res.stdout, re.M)}


@pytest.mark.skipif(not Path(PYTHON).exists() or shutil.which("bpftrace") is None,
                    reason="needs Debian's python3.11 (its USDT probes) and bpftrace")
@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_python_function_entry(backend, tmp_path):
    script = tmp_path / "profiled.py"
    script.write_text(PROFILED)
    res = ok(run_ustack("trace", "--backend", backend,
                        f"usdt:{PYTHON}:function__entry arg0:string arg1:string",
                        "-c", f"{PYTHON} {script}"))
    calls: dict = {}
    for r in parse_trace(res.stdout):
        v = label_values(r["label"])
        key = (v["arg0"].strip('"'), v["arg1"].strip('"'))
        calls[key] = calls.get(key, 0) + 1
    assert calls[(str(script), "foo")] == 7
    assert calls == _python_calls_bpftrace(script)
    res = ok(run_ustack("count", "--backend", backend, f"usdt:{PYTHON}:python:function__entry",
                        "-c", f"{PYTHON} {script}"))
    assert sum(s["count"] for s in parse_counts(res.stdout)) == sum(calls.values())


@pytest.mark.parametrize("spec, fetch", [
    ("-8@%rdi", ("%di", "s64")), ("4@-12(%rbp)", ("-12(%bp)", "u32")),
    ("-4@$5", ("\\5", "s32")), ("-4@$-5", ("\\-5", "s32")),
    ("8@16(%rsp)", ("+16(%sp)", "u64")), ("1@%dl", ("%dx", "u8")),
    ("-2@%r9w", ("%r9", "s16")), ("4@%r12d", ("%r12", "u32")), ("1@%sil", ("%si", "u8")),
    ("1@%ah", ("%ax", "b8@8/64")), ("8@(%rax)", ("+0(%ax)", "u64")), ("%rbx", ("%bx", "u64")),
])
def test_argument_specs_as_fetch_args(spec, fetch):
    from ustack.probes.usdt_args import usdt_fetch
    assert usdt_fetch(spec, "p:n") == fetch


def test_argument_spec_ustack_cannot_fetch():
    from ustack.model import UstackError
    from ustack.probes.usdt_args import usdt_fetch
    with pytest.raises(UstackError, match=r"^USDT probe p:n: cannot fetch its argument "
                                          r"'8@\(%rax,%rbx,8\)'"):
        usdt_fetch("8@(%rax,%rbx,8)", "p:n")


def test_spellings():
    from ustack.probes.spec import parse_event
    s = parse_event("usdt:/bin/x:prov:na*e arg0 n=arg1:string")
    assert (s.kind, s.path, s.provider, s.name) == ("usdt", "/bin/x", "prov", "na*e")
    assert s.args == (("arg0", "arg0", ""), ("n", "arg1", "string"))
    s = parse_event("usdt:/bin/x:name")
    assert (s.provider, s.name) == (None, "name")
    with pytest.raises(Exception, match="need usdt:PATH:PROVIDER:NAME or usdt:PATH:NAME"):
        parse_event("usdt:/bin/x")


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="needs Debian's python3.11")
def test_running_python_by_name_with_p(tmp_path):
    """-p PID with the binary named as the process maps it (python3.11):
    the semaphore of a process already running is raised too."""
    from helpers import run_attached, spawn
    script = tmp_path / "waits.py"
    script.write_text(PROFILED.replace("sys.setprofile(profiler)\n",
                                       "sys.setprofile(profiler)\nsys.stdin.readline()\n"))
    target = spawn(PYTHON, script, stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "trace", "usdt:python3.11:function__entry arg1:string"))
    finally:
        target.kill()
    names = [label_values(r["label"])["arg1"] for r in parse_trace(res.stdout)]
    assert names.count('"foo"') == 7, names


def test_library_probe_named_with_p_and_its_semaphore(tmp_path):
    """-p PID with a library named as the process maps it (usdt_lib, loaded
    by dlopen before ustack attaches): every hit with its argument values,
    and the library's semaphore raised in the running process."""
    from helpers import run_attached, spawn
    lib = build("usdt_lib", flags=O2_NOFP, kind="shared")
    prog = build("usdt_dl", flags=O2_NOFP)
    target = spawn(prog, lib, N, stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "trace", "usdt:usdt_lib:demolib:tick arg0 arg1"))
    finally:
        target.kill()
    rows = parse_trace(res.stdout)
    assert [label_values(r["label"]) for r in rows] == \
        [{"arg0": str(i), "arg1": str(-i)} for i in range(N)]
    assert {r["label"].split()[0] for r in rows} == {f"usdt:{lib}:demolib:tick"}
    assert funcs(rows[0]["frames"])[:3] == ["lib_step", "lib_run", "main"]
    # untraced, the library's is-enabled test never holds
    with subprocess.Popen([str(prog), str(lib), str(N)], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as p:
        out, _ = p.communicate("go\n", timeout=30)
    assert out == "enabled=0\n"


@pytest.mark.parametrize("backend", ["bpf", "perf"])
def test_library_probe_by_name_with_c(backend):
    """A library name without -p is found as the dynamic linker would
    (libstdc++'s libstdcxx:throw, fired by __cxa_throw): cxx_throw 6 throws
    on its 3 odd calls."""
    from helpers import build_cxx
    lib = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    if "libstdc++.so.6 " not in lib:
        pytest.skip("libstdc++.so.6 is not in the linker cache")
    prog = build_cxx("cxx_throw", ("-O2", "-g", "-fno-omit-frame-pointer"))
    res = ok(run_ustack("count", "--backend", backend, "usdt:libstdc++:throw",
                        "-c", f"{prog} 6"))
    stacks = parse_counts(res.stdout)
    assert [s["count"] for s in stacks] == [3], res.stdout
    names = funcs(stacks[0]["frames"])
    assert names[0] == "__cxa_throw" and names[2:5] == ["f2(long)", "f1(long)", "main"]


def test_note_addresses_follow_stapsdt_base(prog, tmp_path):
    """A note written before its file's sections moved (prelink) has a base
    other than .stapsdt.base's address: pc and semaphore move by the
    difference, as SystemTap defines (here: a note's base raised by 0x1000)."""
    from elftools.elf.elffile import ELFFile
    from ustack.objfile.stapsdt import sdt_probes
    data = bytearray(prog.read_bytes())
    with open(prog, "rb") as f:
        note = next(n for n in ELFFile(f).get_section_by_name(".note.stapsdt").iter_notes()
                    if n["n_descdata"][24:].split(b"\0")[1] == b"guarded")
    base_at = note["n_offset"] + 12 + 8 + 8        # header, "stapsdt\0", pc
    base = int.from_bytes(data[base_at:base_at + 8], "little")
    data[base_at:base_at + 8] = (base + 0x1000).to_bytes(8, "little")
    moved = tmp_path / "moved"
    moved.write_bytes(bytes(data))
    before = next(p for p in sdt_probes(str(prog)) if p.name == "guarded")
    after = next(p for p in sdt_probes(str(moved)) if p.name == "guarded")
    assert before.semaphore and after.args == before.args
    assert (after.pc, after.semaphore) == (before.pc - 0x1000, before.semaphore - 0x1000)


@pytest.mark.parametrize("spec, fetch", [
    ("-8@gbase(%rip)", ("@+0x3000", "s64")), ("-8@8+garr(%rip)", ("@+0x3108", "s64")),
    ("-8@garr+16(%rip)", ("@+0x3110", "s64")), ("4@garr-4(%rip)", ("@+0x30fc", "u32")),
])
def test_global_argument_specs(spec, fetch):
    from ustack.model import UstackError
    from ustack.probes.usdt_args import usdt_fetch
    at = {"gbase": 0x3000, "garr": 0x3100}.get
    assert usdt_fetch(spec, "p:n", at) == fetch
    with pytest.raises(UstackError, match=r"^USDT probe p:n: its argument '-8@gone\(%rip\)' "
                                          r"reads gone, which the file's symbols do not name$"):
        usdt_fetch("-8@gone(%rip)", "p:n", at)


@pytest.mark.skipif(not Path(PYTHON).exists(), reason="needs Debian's python3.11")
def test_python_function_entry_counted_by_its_python_frame(tmp_path):
    """count at python:function__entry: the stacks of foo's 7 profiled calls
    have foo as their innermost Python frame. The probe's caller is the
    eval loop's unlikely part (_PyEval_EvalFrameDefault.cold), unnamed in
    Debian's stripped python3.11: its Python frames were left unmerged."""
    import signal
    from helpers import finish, spawn, start_ustack, stop, wait_tracing
    script = tmp_path / "held.py"
    script.write_text(PROFILED.replace("sys.setprofile(profiler)\n",
                                       "sys.stdin.readline()\nsys.setprofile(profiler)\n")
                      + "print('done', flush=True)\nsys.stdin.readline()\n")
    target = subprocess.Popen([PYTHON, str(script)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    us = start_ustack("count", "--backend", "bpf", "usdt:python3.11:function__entry",
                      "-p", str(target.pid), stdout=subprocess.PIPE)
    try:
        wait_tracing(us)
        target.stdin.write(b"go\n")
        target.stdin.flush()
        assert target.stdout.readline() == b"done\n"
        us.send_signal(signal.SIGINT)   # the code objects are read while it lives
        out, err = finish(us)
    finally:
        stop(us)
        stop(target)
    assert us.returncode == 0, err
    by_leaf: dict = {}
    for s in parse_counts(out):
        # a Python frame: "foo [python] FILE:LINE"
        python = [f.split(" [python] ")[0] for f, _ in s["frames"] if " [python] " in f]
        key = python[0] if python else None
        by_leaf[key] = by_leaf.get(key, 0) + s["count"]
    assert by_leaf.get("foo") == 7, out
    assert None not in by_leaf, out
