"""Arguments by name: 'uprobe:PATH:FUNC n len buf' fetches the
parameters DWARF describes at the probe, typed, on a -O2 C function (six
register and four stack-passed arguments), a C++ method (with its implicit
`this`) and a Go function (Go's register ABI); `$retval` typed from the
return type; `ustack list -v`.

Oracles: the same values fetched by register as the ABI places them (the
fetch-args users wrote before), gdb's `info args` at a breakpoint on the
function's first instruction (run with ASLR off, as gdb runs programs, so
pointers compare equal), bpftrace -lv and perf probe -V for the listing,
and the values the programs pass (tests/programs/args.c, args_cxx.cpp,
goargs/)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from helpers import (FP, MIX, N, O2_NOFP, build, build_cxx, build_go, disassembly,
                     fail_one_line, label_values, nm_symbols, no_aslr, ok, parse_trace,
                     run_attached, run_ustack, spawn, split_and_dwz)
from ustack.model import UstackError
from ustack.objfile import debuginfo
from ustack.objfile.dwarf_params import DwarfParams
from ustack.objfile.elf import ElfImage
from ustack.commands.list import format_params
from ustack.probes.resolve import resolve_uprobes
from ustack.probes.spec import parse_event

COLORS = {"RED": 0, "GREEN": 5, "BLUE": 6}    # enum color of args.c
# the same ten arguments where the SysV ABI puts them at mix's entry: six
# registers, then the stack words after the return address at (%sp)
MIX_BY_REGISTER = ("i=%di:s32 len=%si:u64 buf=+0(%dx):string c=%cx:s32 neg=%r8:s16 "
                   "flag=%r9:u8 ok=+8(%sp):u8 ch=+16(%sp):u8 big=+24(%sp):s64 "
                   "last=+32(%sp):x64")


@pytest.fixture(scope="module")
def args_c():
    return build("args", flags=O2_NOFP)


@pytest.fixture(scope="module")
def args_cxx():
    return build_cxx("args_cxx", O2_NOFP)


def trace_values(*args, backend="perf") -> list[dict]:
    """{name: value text} per event of `ustack trace ARGS…`."""
    res = ok(run_ustack("trace", "--backend", backend, *args))
    return [label_values(r["label"]) for r in parse_trace(res.stdout)]


def gdb_info_args(command: str, function: str, hits: int = N) -> list[dict]:
    """{name: value text} of gdb's `info args` at each of the first `hits`
    hits of a breakpoint on the first instruction of `function`."""
    if shutil.which("gdb") is None:
        pytest.skip("gdb is not installed (the oracle)")
    prog, *argv = command.split()[3:]          # after 'setarch x86_64 -R'
    cmd = ["gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off",
           "-ex", f"break *'{function}'", "-ex", "run", "-ex", "info args"]
    for _ in range(hits - 1):
        cmd += ["-ex", "continue", "-ex", "info args"]
    out = subprocess.run(cmd + ["--args", prog, *argv], capture_output=True, text=True,
                         timeout=120, stdin=subprocess.DEVNULL).stdout
    hits_out = []
    for block in out.split("Breakpoint 1, ")[1:]:
        values = dict(re.findall(r"^(\w+) = (.*)$", block, re.M))
        hits_out.append(values)
    assert len(hits_out) == hits, out
    return hits_out


def as_value(text: str):
    """A printed value as a comparable Python value, whichever printed it:
    ustack ('5', '-7', '0x55…', '"hello"', "'A'", 'true') or gdb
    ('0x55… "hello"', "65 'A'", "200 '\\310'", '0x55… <last>', 'BLUE')."""
    text = text.strip()
    m = re.fullmatch(r'(?:0x[0-9a-f]+ )?"(.*)"', text)
    if m:
        return m.group(1)
    m = re.fullmatch(r"(-?\d+) '.*'", text)               # gdb's chars
    if m:
        return int(m.group(1))
    m = re.fullmatch(r"'(.)'", text)                      # ustack's chars
    if m:
        return ord(m.group(1))
    if text in ("true", "false"):
        return int(text == "true")
    if text in COLORS:
        return COLORS[text]
    m = re.fullmatch(r"(0x[0-9a-f]+)(?: <.*>)?", text)
    if m:
        return int(m.group(1), 16)
    return int(text)


def as_values(rows: list[dict]) -> list[dict]:
    return [{k: as_value(v) for k, v in row.items()} for row in rows]


# --- values: by name = by register = gdb ------------------------------------------

@pytest.mark.kernel
@pytest.mark.parametrize("backend", ["perf", "tracefs"])
def test_c_args_by_name_as_registers_and_gdb(args_c, backend):
    command = no_aslr(args_c)
    by_name = trace_values(f"uprobe:{args_c}:mix {MIX}", "-c", command, backend=backend)
    by_reg = trace_values(f"uprobe:{args_c}:mix {MIX_BY_REGISTER}", "-c", command,
                          backend=backend)
    gdb = gdb_info_args(command, "mix")
    assert list(by_name[0]) == MIX.split()
    assert as_values(by_name) == as_values(by_reg) == as_values(gdb)
    # and typed as the program passes them
    assert [(r["i"], r["len"], r["buf"], r["neg"], r["flag"], r["ok"], r["ch"], r["big"])
            for r in by_name] == [(str(i), str(12 + i), '"hello"', str(-7 - i), "200",
                                   "true" if i & 1 else "false", repr(chr(65 + i)),
                                   "-1000000000000") for i in range(N)]
    assert re.fullmatch(r"0x[0-9a-f]+", by_name[0]["last"])


@pytest.mark.kernel
def test_cxx_method_this_by_name_as_registers_and_gdb(args_cxx):
    command = no_aslr(args_cxx)
    probe = f"uprobe:{args_cxx}:shop::Counter::add"
    by_name = trace_values(f"{probe} this k tag", "-c", command)
    by_reg = trace_values(f"{probe} this=%di:x64 k=%si:s32 tag=+0(%dx):string",
                          "-c", command)
    gdb = gdb_info_args(command, "shop::Counter::add")
    assert as_values(by_name) == as_values(by_reg) == as_values(gdb)
    assert [(r["k"], r["tag"]) for r in by_name] == [(str(10 + i), '"tag"')
                                                     for i in range(N)]


@pytest.mark.kernel
def test_go_args_by_name_and_by_abi_register(tmp_path):
    """main.work(i, 100+i, -5-i, i%2 == 0), attached with -p to a target
    that waits on stdin until the probes are live; stripped, the same
    values as $arg1…$arg4 of Go's register ABI."""
    want = [dict(i=str(i), count=str(100 + i), delta=str(-5 - i),
                 even="true" if i % 2 == 0 else "false") for i in range(N)]
    prog = build_go("goargs")
    target = spawn(prog, N, "-", stdin=subprocess.PIPE)
    res = ok(run_attached(target, "trace", f"uprobe:{prog}:main.work i count delta even"))
    assert [label_values(r["label"]) for r in parse_trace(res.stdout)] == want
    stripped = build_go("goargs", strip=True)
    target = spawn(stripped, N, "-", stdin=subprocess.PIPE)
    res = ok(run_attached(target, "trace", f"uprobe:{stripped}:main.work i=$arg1:s64 "
                          "count=$arg2:s64 delta=$arg3:s32 even=$arg4:u8"))
    assert [as_values([label_values(r["label"])])[0] for r in parse_trace(res.stdout)] \
        == as_values(want)


@pytest.mark.kernel
def test_go_args_by_name_as_gdb():
    prog = build_go("goargs")
    got = trace_values(f"uprobe:{prog}:main.work i count delta even", "-c", f"{prog} {N}")
    gdb = gdb_info_args(f"setarch x86_64 -R {prog} {N}", "main.work")
    assert as_values(got) == as_values([{k: v for k, v in g.items() if k != "~r0"}
                                        for g in gdb])


def test_names_become_the_abis_fetch_args(args_c):
    """What the kernel is asked for: the registers and stack slots the ABI
    gives mix's arguments at its entry (the stack ones counted from the
    CFA, %sp + 8), typed from DWARF; char * read as a string."""
    [probe] = resolve_uprobes(parse_event(f"uprobe:{args_c}:mix {MIX}"))
    assert probe.fetch_args == tuple(MIX_BY_REGISTER.split())
    assert dict(probe.arg_kinds) == dict(
        i="dec", len="dec", buf="str", c="dec", neg="dec", flag="dec", ok="bool",
        ch="char", big="dec", last="hex")
    [probe] = resolve_uprobes(parse_event(f"uprobe:{args_c}:mix count=len"))
    assert probe.fetch_args == ("count=%si:u64",)


@pytest.mark.kernel
def test_past_the_entry_from_location_lists(args_c):
    """At each instruction of mix (objdump's) where DWARF still has i, len
    and buf in a register or slot, probing there by name gives the values
    the program passes, also where -O2 code has moved them to another
    register (the location list's entry at that address); where it has
    not, resolution refuses (tested below), it never guesses."""
    entry, size = nm_symbols(args_c)["mix"]
    events, moved = [], False
    for addr, _text in disassembly(args_c)["mix"][1:]:
        if addr >= entry + size:          # the padding after the ret
            break
        event = f"uprobe:{args_c}:mix+{addr - entry:#x} i len buf"
        try:
            [probe] = resolve_uprobes(parse_event(event))
        except UstackError as e:
            assert "cannot fetch" in str(e), e
            continue
        events.append(event)
        moved |= probe.fetch_args != ("i=%di:s32", "len=%si:u64", "buf=+0(%dx):string")
    assert moved, "no offset where a parameter lives elsewhere than at the entry"
    recs = parse_trace(ok(run_ustack("trace", *events, "-c", f"{args_c} 0 {N}")).stdout)
    assert len(recs) == len(events) * N
    for r in recs:
        values = label_values(r["label"])
        i = int(values["i"])
        assert values == dict(i=str(i), len=str(12 + i), buf='"hello"'), r["label"]


# --- $retval typed ---------------------------------------------------------------

@pytest.mark.kernel
def test_retval_typed_from_dwarf(args_c):
    """diff returns -3 each call: signed int, not 0xfffffffd; a char *
    in hex, or the string with :string; a _Bool as true/false."""
    recs = parse_trace(ok(run_ustack(
        "trace", f"uretprobe:{args_c}:diff $retval", f"uretprobe:{args_c}:diff raw=$retval:u32",
        f"uretprobe:{args_c}:color_name $retval", f"uretprobe:{args_c}:color_name "
        "name=$retval:string", f"uretprobe:{args_c}:is_odd $retval",
        "-c", f"{args_c} 0 {N}")).stdout)
    heads = [r["label"].split(":", 2)[2] for r in recs]
    assert heads.count("diff retval=-3") == N
    assert heads.count(f"diff raw={(1 << 32) - 3}") == N
    assert heads.count('color_name name="blue"') == N
    assert len([h for h in heads if re.fullmatch(r"color_name retval=0x[0-9a-f]+", h)]) == N
    assert [h for h in heads if h.startswith("is_odd")] == [
        f"is_odd retval={'true' if i & 1 else 'false'}" for i in range(N)]


# --- list -v -----------------------------------------------------------------------

def ustack_params(*args) -> dict:
    """`ustack list -v` -> {function: [(type, name), …]} ($retval left out:
    bpftrace does not list it)."""
    res = run_ustack("list", "-v", *args)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    return parse_lv(res.stdout, skip="$retval")


def parse_lv(text: str, skip: str = "") -> dict:
    out: dict = {}
    current = None
    for line in text.splitlines():
        if line.startswith("uprobe:"):
            current = out.setdefault(line.rsplit(":", 1)[1], [])
        elif line.startswith("    ") and current is not None:
            typ, _, name = line.strip().rpartition(" ")
            if name != skip:
                current.append((typ, name))
    return out


@pytest.mark.kernel
def test_list_v_matches_bpftrace(args_c):
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed (the oracle)")
    ours = ustack_params(args_c)
    theirs = parse_lv(subprocess.run(["bpftrace", "-lv", f"uprobe:{args_c}:*"],
                                     capture_output=True, text=True, check=True).stdout)
    assert ours == theirs
    assert ours["mix"][:3] == [("int", "i"), ("size_type", "len"), ("const char*", "buf")]


@pytest.mark.kernel
def test_list_v_go_matches_bpftrace():
    if shutil.which("bpftrace") is None:
        pytest.skip("bpftrace is not installed (the oracle)")
    prog = build_go("goargs")
    theirs = parse_lv(subprocess.run(["bpftrace", "-lv", f"uprobe:{prog}:main.work"],
                                     capture_output=True, text=True, check=True).stdout)
    assert ustack_params(prog, "main.work") == theirs == {"main.work": [
        ("int", "i"), ("int64", "count"), ("int32", "delta"), ("bool", "even"),
        ("int64", "~r0")]}


@pytest.mark.kernel
def test_list_v_cxx_matches_perf_probe(args_cxx):
    """bpftrace 0.17 lists no C++ parameters; perf probe -V does (it drops
    const and namespaces: compared without them)."""
    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (the oracle)")
    res = subprocess.run(["perf", "probe", "-x", str(args_cxx), "-V",
                          "_ZN4shop7Counter3addEiPKc"], capture_output=True, text=True)
    theirs = sorted(tuple(line.strip().split("\t")) for line in res.stdout.splitlines()
                    if line.startswith("\t\t"))
    ours = ustack_params(args_cxx, "shop::Counter::add*")

    def plain(typ):
        return re.sub(r"\bconst\b|\w+::", "", typ).replace(" ", "")
    assert list(ours.values()) == [[("shop::Counter* const", "this"), ("int", "k"),
                                    ("const char*", "tag")]]
    assert sorted((plain(t), n) for t, n in list(ours.values())[0]) == \
        [(plain(t), n) for t, n in theirs]


def test_list_v_without_dwarf_lists_names_only(tmp_path):
    prog = build("args", flags=("-O2",))
    assert ustack_params(prog, "mix") == {"mix": []}


# --- errors: one line, nothing left behind ------------------------------------------

@pytest.mark.kernel
def test_unknown_parameter_lists_the_parameters(args_c):
    msg = fail_one_line(run_ustack("trace", f"uprobe:{args_c}:mix i nope",
                                   "-c", f"{args_c} 0 1"))
    assert msg == ("ustack: mix has no parameter 'nope'; its parameters: "
                   "i, len, buf, c, neg, flag, ok, ch, big, last")


@pytest.mark.kernel
@pytest.mark.parametrize("probe, why", [
    ("by_value p", "cannot fetch p at by_value: it is a struct pair passed by value "
                   "(16 bytes); fetch-args read scalars, pointers and strings"),
    ("by_value x", "cannot fetch x at by_value: it is a floating-point double, which "
                   "uprobe fetch-args cannot show"),
    ("by_value x:x64", "cannot fetch x at by_value: it is in register xmm0, which uprobe "
                       "fetch-args cannot read"),
    ("mix n=i:string", "cannot fetch i at mix: it is int, not a pointer: it cannot be "
                       "read as a string"),
])
def test_cannot_fetch_says_why(args_c, probe, why):
    msg = fail_one_line(run_ustack("trace", f"uprobe:{args_c}:{probe}",
                                   "-c", f"{args_c} 0 1"))
    assert msg == f"ustack: {why}"


def test_parameters_are_gone_at_the_return(args_c):
    with pytest.raises(UstackError) as e:
        resolve_uprobes(parse_event(f"uprobe:{args_c}:mix i".replace("uprobe", "uretprobe")))
    assert str(e.value) == ("cannot fetch i at the return of mix: its parameters are gone "
                            "by then; fetch them with a uprobe on its entry (a uretprobe "
                            "has $retval)")


@pytest.mark.kernel
def test_entry_value_refused_past_the_entry(args_c):
    """At mix's last instruction (its ret) -O2 code has reused c's
    register: DWARF has only c's value at entry, which is gone."""
    size = nm_symbols(args_c)["mix"][1]
    msg = fail_one_line(run_ustack("trace", f"uprobe:{args_c}:mix+{size - 1:#x} c",
                                   "-c", f"{args_c} 0 1"))
    assert msg == (f"ustack: cannot fetch c at mix+{size - 1:#x}: DWARF knows it there "
                   "only as the value it had at the function's entry "
                   "(DW_OP_entry_value), which the registers no longer hold; probe the "
                   "function's entry")


@pytest.mark.kernel
def test_no_dwarf_suggests_registers(tmp_path):
    prog = build("args", flags=("-O2",))
    msg = fail_one_line(run_ustack("trace", f"uprobe:{prog}:mix i", "-c", f"{prog} 0 1"))
    assert msg == (f"ustack: cannot fetch i: {prog} has no DWARF for mix (build it with -g "
                   "or install its debug file); fetch by register instead: $arg1…$arg6 "
                   "in the C ABI")


def test_list_v_through_a_dwz_debug_file(tmp_path, monkeypatch):
    """A stripped program whose debug file, found by its debuglink, was
    compressed by `dwz -m`: types and names partly in the alt file; the
    same parameters as the unstripped program's."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(debuginfo, "DEBUG_ROOTS", [str(tmp_path / "no-debug-root")])
    progs = [build("args", flags=O2_NOFP), build("chain", flags=O2_NOFP)]
    prog, stripped, debug = split_and_dwz(tmp_path, progs, "common.dwz")["args"]
    info = subprocess.run(["readelf", "--debug-dump=info", str(debug)], capture_output=True,
                          text=True, check=True).stdout
    assert "<alt 0x" in info                 # DIEs did move to the alt file
    want = format_params(str(prog), "mix").replace(str(prog), "PROG")
    assert format_params(str(stripped), "mix").replace(str(stripped), "PROG") == want
    assert "    const char* buf\n" in want


def test_stripped_go_suggests_its_register_abi():
    prog = build_go("goargs", strip=True)
    with pytest.raises(UstackError) as e:
        resolve_uprobes(parse_event(f"uprobe:{prog}:main.work i"))
    assert str(e.value) == (f"cannot fetch i: {prog} has no DWARF for main.work (go build "
                            "leaves it out with -ldflags=-s or -w); fetch by register "
                            "instead: $arg1…$arg9 in Go's register ABI")


def test_bare_words_are_parameter_names():
    assert parse_event("uprobe:/bin/x:f n len=n buf:string %di").args == (
        ("n", "n", ""), ("len", "n", ""), ("buf", "buf", "string"), ("arg4", "%di", ""))


def test_answers_kept_on_disk_are_the_dwarfs(args_c, args_cxx, tmp_path, monkeypatch):
    """A second process reads each function's parameters from the cache
    (by build-id and address) and gets exactly what the DWARF gave."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    for prog, func in ((args_c, "mix"), (args_c, "by_value"), (args_cxx, "_ZN4shop7Counter3addEiPKc")):
        image = ElfImage.open(str(prog))
        addr = nm_symbols(prog)[func][0]
        cold = DwarfParams(image).function_at(addr)
        assert list((tmp_path / "cache" / "params").iterdir())
        assert DwarfParams(image).function_at(addr) == cold
        assert cold.params and cold.params[0].locations


@pytest.mark.kernel
def test_unoptimized_slot_refused_at_the_entry_read_past_the_prologue():
    """At -O0 DWARF keeps i in a stack slot the prologue fills: at the
    entry it holds whatever was there (a value read there would be wrong),
    so ustack refuses; past the prologue, where gdb breaks, it reads what
    the program passed."""
    args_o0 = build("args", flags=FP)
    msg = fail_one_line(run_ustack("trace", f"uprobe:{args_o0}:mix i", "-c", f"{args_o0} 0 1"))
    assert msg == ("ustack: cannot fetch i at mix: DWARF keeps it in a stack slot that "
                   "the function's prologue writes after the entry (code built without "
                   "optimization), so at the entry it holds no value yet; probe past the "
                   "prologue (FUNC+OFFSET) or fetch the register it arrives in ($arg1…)")
    gdb = subprocess.run(["gdb", "-batch", "-nx", "-ex", "break mix", str(args_o0)],
                         capture_output=True, text=True, timeout=60).stdout
    past = int(re.search(r"Breakpoint 1 at (0x[0-9a-f]+)", gdb).group(1), 16)
    offset = past - nm_symbols(args_o0)["mix"][0]
    assert 0 < offset < 64, gdb
    rows = trace_values(f"uprobe:{args_o0}:mix+{offset:#x} i neg big", "-c",
                        f"{args_o0} 0 {N}")
    assert [(r["i"], r["neg"], r["big"]) for r in rows] == \
        [(str(i), str(-7 - i), "-1000000000000") for i in range(N)]
