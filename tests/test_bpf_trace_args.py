"""trace with fetch-args unwound in the kernel: the BPF program fetches the
arguments itself (capture/bpf_fetchargs.py) and writes them into each
event's record after its frames, so `--backend bpf` prints the same
arguments as the kernel's own uprobe fetch (`--backend perf`, the oracle)
and the same frames, on -O2 binaries without frame pointers; `--backend
auto` takes that path when the program fetches every arg exactly, else the
perf path with a note saying why."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import (MIX, O2_NOFP, build, build_cxx, build_go, fail_one_line,
                     label_values, no_aslr, ok, parse_trace, private_copy, run_ustack)

pytestmark = pytest.mark.kernel

IN_KERNEL = "[backend bpf, unwind dwarf; unwound in the kernel]"
COPIED = "[backend perf, unwind dwarf]"
CHAIN = ["d", "c", "b", "a", "main"]


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=O2_NOFP)


@pytest.fixture(scope="module")
def args_c() -> Path:
    return build("args", flags=O2_NOFP)


@pytest.fixture(scope="module")
def strargs() -> Path:
    return build("strargs", flags=O2_NOFP)


def traced(backend: str, *args) -> list[dict]:
    """The records of `ustack trace --backend BACKEND ARGS…`, checked to
    have run where asked, nothing lost or cut."""
    res = ok(run_ustack("trace", "--backend", backend, *args))
    head = res.stderr.splitlines()[0]
    assert (IN_KERNEL if backend == "bpf" else COPIED) in head, res.stderr
    assert "Lost" not in res.stderr and "cut short" not in res.stderr, res.stderr
    return parse_trace(res.stdout)


def frames(record: dict) -> list[tuple]:
    return [(f["func"], f["off"], f["module"]) for f in record["frames"]]


def both(*args, pick=None) -> tuple[list, list]:
    """The same run through the kernel's unwinder and the copy path: the
    same labels (so the same arguments) and frames, event by event (the
    events numbered `pick` only, when given)."""
    kernel = traced("bpf", *args)
    copied = traced("perf", *args)
    assert len(kernel) == len(copied)
    for i, (k, c) in enumerate(zip(kernel, copied)):
        if pick is None or i in pick:
            assert (k["label"], frames(k)) == (c["label"], frames(c)), i
    return kernel, copied


def test_named_arg_with_the_whole_chain(chain):
    n = 5
    kernel, _ = both(f"uprobe:{chain}:d i", "-c", f"{chain} {n}")
    assert [label_values(r["label"]) for r in kernel] == [{"i": str(i)} for i in range(n)]
    for r in kernel:
        assert [f[0] for f in frames(r)][:5] == CHAIN


def test_registers_stack_words_and_types(args_c):
    """mix's ten arguments by name (registers, stack slots, typed from
    DWARF: signed, unsigned, bool, char, enum, pointer) and the same by
    register and $stackN, with raw types, dereferences and $comm; pointers
    compare equal with ASLR off. buf is a literal in a page the program
    first touches in mix's body, after the probe: BPF cannot read it there,
    ustack reads it (and values read from it) from the file that page maps."""
    command = no_aslr(args_c)
    kernel, _ = both(f"uprobe:{args_c}:mix {MIX}", "-c", command)
    assert [(r["i"], r["buf"], r["neg"], r["ok"], r["ch"], r["big"])
            for r in map(label_values, (k["label"] for k in kernel))] == [
        (str(i), '"hello"', str(-7 - i), "true" if i & 1 else "false", repr(chr(65 + i)),
         "-1000000000000") for i in range(3)]
    raw = ("a=%di b=%si:u16 c=%r9:s8 d=%r8:x16 e=$stack0 f=$stack2:s64 g=$stack "
           "h=+0($stack4):s32 i=+8(+0($stack4)):u64 j=$comm k=\\-5:s8 l=+0(%sp):x32 "
           "m=+0(+24(%sp)):b4@1/8 n=+0($stack4):u8[4] o=+1(%dx):x32 p=+0(%dx):b4@4/8")
    kernel, _ = both(f"uprobe:{args_c}:mix {raw}", "-c", command)
    got = label_values(kernel[1]["label"])
    assert (got["a"], got["b"], got["c"], got["j"], got["k"], got["n"]) == \
        ("0x1", "13", "-56", '"args"', "-5", "{1,0,0,0}")
    # "hello" at the first call too, its page read from the file: "ello", 'h' >> 4
    first = label_values(kernel[0]["label"])
    assert (first["o"], first["p"]) == ("0x6f6c6c65", str(ord("h") >> 4))


def test_cxx_method_and_go_function_by_name():
    """A C++ method's `this` and int, and a Go function's arguments in Go's
    register ABI (unwound with DWARF rules on both paths)."""
    cxx = build_cxx("args_cxx", O2_NOFP)
    kernel, _ = both(f"uprobe:{cxx}:shop::Counter::add this k", "-c", no_aslr(cxx))
    assert [label_values(r["label"])["k"] for r in kernel] == ["10", "11", "12"]
    go = build_go("goargs")
    kernel, _ = both("--unwind", "dwarf", f"uprobe:{go}:main.work i count delta even",
                     "-c", f"{go} 3")
    assert [label_values(r["label"]) for r in kernel] == [
        dict(i=str(i), count=str(100 + i), delta=str(-5 - i),
             even="true" if i % 2 == 0 else "false") for i in range(3)]
    assert [f[0] for f in frames(kernel[0])][:3] == ["main.work", "main.main", "runtime.main"]


def test_strings_and_faults(strargs):
    """Strings, NULL and bad pointers, nested dereferences that fault and
    strings longer than the kernel takes, as the kernel's fetch gives them:
    a string that cannot be read is "", a value 0."""
    spec = (f"uprobe:{strargs}:say s=+0(%di):string n=%si:s64 v=+0(%dx):s64 "
            "next=+8(%dx):x64 nv=+0(+8(%dx)):s64 c=$comm u=+0(%di):ustring")
    kernel, _ = both(spec, "-c", no_aslr(strargs))      # 3 rounds
    got = [label_values(r["label"]) for r in kernel]
    assert len(got) == 15
    assert [(g["s"], g["n"], g["v"], g["nv"], g["c"], g["u"]) for g in got[:5]] == [
        ('"hello"', "1", "5", "7", '"strargs"', '"hello"'),
        ('""', "2", "7", "0", '"strargs"', '""'),
        ('""', "3", "0", "0", '"strargs"', '""'),
        ('""', "4", "0", "0", '"strargs"', '""'),
        # over 4095 bytes: none, so the room the others measured goes to it
        ('"xxxxxxx"', "5", "5", "7", '""', '""')]
    assert got[5:10] == got[10:] == got[:5]
    assert got[2]["next"] == "0x0"


def test_a_string_through_nested_dereferences(strargs):
    """p->next->name and p->name; where a dereference on the way faults
    (p NULL or bad, tail->next NULL), BPF gives "" and the kernel's record points at the
    next string's bytes (see bpf_fetchargs): those events are not compared."""
    spec = (f"uprobe:{strargs}:say name=+0(+16(%dx)):string "
            "next_name=+0(+16(+8(%dx))):string c=$comm")
    kernel, _ = both(spec, "-c", f"{strargs} 0", pick=(0, 4))
    assert [label_values(r["label"]) for r in kernel] == [
        {"name": '"head"', "next_name": '"tail"', "c": '"strargs"'},
        {"name": '"tail"', "next_name": '""', "c": '"strargs"'},
        {"name": '""', "next_name": '""', "c": '"strargs"'},
        {"name": '""', "next_name": '""', "c": '"strargs"'},
        {"name": '"head"', "next_name": '"tail"', "c": '"strargs"'}]


def test_strings_share_one_page_as_in_the_kernel(strargs):
    """Strings of 4000, 3000, 5000 and 1000 bytes and the comm: the
    kernel's uprobe record holds one page of fetched bytes, the string
    that overflows it is cut, those after it are "" (a string over 4095
    bytes too); BPF gives the same bytes."""
    spec = (f"uprobe:{strargs}:shout b=+1000(%di):string c=+2000(%di):string "
            "a=+0(%di):string d=+4000(%di):string e=$comm")
    kernel, _ = both(spec, "-c", f"{strargs} 0")
    (big,) = [label_values(r["label"]) for r in kernel]
    # 4096 bytes less the fixed fields' 20: b whole, c cut, a too long, no room after
    assert {k: len(v) - 2 for k, v in big.items()} == \
        {"b": 4000, "c": 4076 - 4001 - 1, "a": 0, "d": 0, "e": 0}


def test_retval_on_uretprobes(args_c):
    kernel, _ = both(f"uretprobe:{args_c}:diff $retval", f"uretprobe:{args_c}:is_odd r=$retval:u8",
                     "-c", f"{args_c} 0 3")
    by_event = {}
    for r in kernel:
        by_event.setdefault(r["label"].split()[0], []).append(label_values(r["label"]))
    assert by_event[f"uretprobe:{args_c}:diff"] == [{"retval": "-3"}] * 3
    assert by_event[f"uretprobe:{args_c}:is_odd"] == [{"r": str(i & 1)} for i in range(3)]
    for r in kernel:
        assert [f[0] for f in frames(r)][0] == "main"


def test_a_deferred_stack_keeps_its_args(tmp_path, chain):
    """A program exec'd during the run (its words do not name it) has no
    unwind rows in the kernel yet: the event's stack goes to ustack to
    unwind (a deferred record), its arguments with it."""
    fresh = private_copy(chain, tmp_path)
    kernel, _ = both("uprobe:libc.so.6:write fd=%di:s32 n=%dx:u64 s=+0(%si):string",
                     "-c", f"sh -c 'P={fresh}; exec $P 3 write'")
    assert [label_values(r["label"]) for r in kernel] == \
        [{"fd": "3", "n": "1", "s": '"x"'}] * 3
    for r in kernel:
        assert [f[0] for f in frames(r)][:6] == ["write"] + CHAIN


def test_auto_unwinds_in_the_kernel_with_args(chain):
    res = ok(run_ustack("trace", f"uprobe:{chain}:d i n=%di:s64", "-c", f"{chain} 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0], res.stderr
    assert [label_values(r["label"]) for r in parse_trace(res.stdout)] == \
        [{"i": str(i), "n": str(i)} for i in range(2)]
    assert "note:" not in res.stderr


def test_auto_fetches_strings_in_the_kernel(args_c):
    """Strings too, a literal not yet in memory at its first use included
    (its page read from the file it maps), and a $retval string."""
    res = ok(run_ustack("trace", f"uprobe:{args_c}:mix buf s=+0(%dx):string",
                        f"uretprobe:{args_c}:color_name $retval:string",
                        "-c", f"{args_c} 0 2"))
    assert IN_KERNEL in res.stderr.splitlines()[0], res.stderr
    assert "note:" not in res.stderr, res.stderr
    assert [label_values(r["label"]) for r in parse_trace(res.stdout)] == \
        [{"buf": '"hello"', "s": '"hello"'}, {"retval": '"blue"'}] * 2


def test_what_bpf_cannot_fetch(chain):
    """An array of strings: auto takes the perf path and says why; --backend
    bpf refuses in one line, before anything is set up."""
    spec = f"uprobe:{chain}:d a=+0(%sp):string[2]"
    res = ok(run_ustack("trace", spec, "-c", f"{chain} 1"))
    assert COPIED in res.stderr.splitlines()[0], res.stderr
    assert ("note: BPF does not fetch a=+0(%sp):string[2] (arrays of strings are "
            "fetched by the perf backend only); stacks are copied and unwound by "
            "ustack") in res.stderr.splitlines()
    res = run_ustack("trace", "--backend", "bpf", spec, "-c", f"{chain} 1")
    assert fail_one_line(res) == (
        "ustack: trace --backend bpf cannot fetch a=+0(%sp):string[2] (arrays of "
        "strings are fetched by the perf backend only); use --backend perf")


def test_what_the_program_refuses_says_why(chain):
    """compile-time refusals, one sentence naming the arg (no kernel asked)."""
    from ustack.capture.bpf_fetchargs import why_not
    from ustack.probes.resolve import resolve_uprobes
    from ustack.probes.spec import parse_event

    def why(event: str):
        return why_not(resolve_uprobes(parse_event(event)))
    assert why(f"uprobe:{chain}:d a=%di b=+0(%si):string c=$stack3 d=\\7 e=@0x1000 "
               "f=@+0x10:u32 g=+0(-8(%di)):b3@2/8 h=$comm i=+8(%sp):x16[4]") is None
    assert why(f"uprobe:{chain}:d x=%xmm0") == "x=%xmm0 (no register %xmm0 in pt_regs)"
    assert why(f"uprobe:{chain}:d y=%di:symbol") == \
        "y=%di:symbol (BPF does not fetch the type symbol)"
    assert why(f"uprobe:{chain}:d w=%di:u8[2]") == \
        "w=%di:u8[2] (an array is read from memory: it needs a dereference)"
    assert why(f"uprobe:{chain}:d v=$comm:u32") == "v=$comm:u32 ($comm is a string, not u32)"
    assert why(f"uretprobe:{chain}:d z=@+0x10") == (
        "z=@+0x10 (at a uretprobe the function's address, which @+OFFSET counts from, "
        "is not known)")
