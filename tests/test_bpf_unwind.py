"""DWARF unwinding inside BPF (`--backend bpf --unwind dwarf`): stacks of
programs built -O2 -fomit-frame-pointer, counted in the kernel, must be the
very stacks ustack's copy-and-unwind path finds (`--backend perf --unwind
dwarf`), frame by frame with offsets, and those of `perf record
--call-graph dwarf`; a stack the kernel cannot finish says why."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import (O2_NOFP, PERF_BUILD_IDS, build, ok, parse_counts, perf_script_samples,
                     private_copy, run_ustack)

pytestmark = pytest.mark.kernel

CHAIN = ["d", "c", "b", "a", "main"]
IN_KERNEL = "[backend bpf, unwind dwarf; unwound in the kernel]"
COPIED = "[backend perf, unwind dwarf]"
_OFFSET = re.compile(r"^(?P<func>.+?)\+0x(?P<off>[0-9a-f]+)/0x[0-9a-f]+$")


@pytest.fixture(scope="module")
def chain() -> Path:
    return build("chain", flags=O2_NOFP)


def counted(backend: str, *args) -> list[dict]:
    """`ustack count --offsets` with DWARF unwinding on `backend` (bpf:
    in the kernel; perf: the copy path), or `ustack profile` when args
    start with "profile": its stacks, with notes apart."""
    command, args = (args[0], args[1:]) if args[0] == "profile" else ("count", args)
    res = ok(run_ustack(command, "--offsets", "--unwind", "dwarf",
                        "--backend", backend, *args))
    header = res.stderr.splitlines()[0]
    assert (IN_KERNEL if backend == "bpf" else COPIED) in header, header
    assert "Lost" not in res.stderr, res.stderr
    stacks = parse_counts(res.stdout)
    for s in stacks:
        s["notes"] = [f[1:-1] for f, m in s["frames"] if m is None and f.startswith("(")]
        s["frames"] = [(f, m) for f, m in s["frames"] if not (m is None and f.startswith("("))]
    return stacks


def names(frames) -> list[str]:
    return [_OFFSET.match(f)["func"] if _OFFSET.match(f) else f for f, _m in frames]


def same_as_copy_path(*args) -> list[dict]:
    """The in-kernel stacks, asserted equal to the copy path's (the same
    frames, offsets, notes and counts, whatever the order)."""
    kernel = counted("bpf", *args)
    copied = counted("perf", *args)
    key = lambda s: (s["frames"], s["count"])
    assert sorted(map(key, kernel)) == sorted(map(key, copied)), (kernel, copied)
    assert all(s["notes"] == [] for s in kernel + copied), kernel + copied
    return kernel


def test_uprobe_in_o2_no_frame_pointer_chain(chain):
    (stack,) = same_as_copy_path(f"uprobe:{chain}:d", "-c", f"{chain} 7")
    assert stack["count"] == 7
    own = [n for n, (_f, m) in zip(names(stack["frames"]), stack["frames"]) if m == chain.name]
    assert own == CHAIN + ["_start"], stack


def test_syscall_write_through_libc(chain):
    (stack,) = same_as_copy_path("syscall:write", "-c", f"{chain} 5 write")
    assert stack["count"] == 5
    assert names(stack["frames"])[:6] == ["write"] + CHAIN, stack
    assert stack["frames"][0][1] == "libc.so.6"


def _perf_record(perf: str, event: str, argv: list, tmp_path: Path) -> list:
    data = tmp_path / "perf.data"
    rec = subprocess.run([perf, "record", "-q", "-B", *PERF_BUILD_IDS, "-e", event,
                          "--call-graph", "dwarf", "-o", str(data), "--", *argv],
                         capture_output=True, text=True, timeout=60)
    assert rec.returncode == 0, rec.stderr
    script = subprocess.run([perf, "script", "-i", str(data)], capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0, script.stderr
    return perf_script_samples(script.stdout)


def _as_perf_shows(frames) -> list[tuple[str, str]]:
    """Our frames as perf script prints them: a caller's pc is the return
    address - 1 (the call instruction), ustack's the return address."""
    out = []
    for i, (f, module) in enumerate(frames):
        m = _OFFSET.match(f)
        out.append((f"{m['func']}+{int(m['off'], 16) - (i > 0):#x}", module))
    return out


def test_same_stacks_as_perf_record_dwarf(chain, tmp_path):
    """syscall:write from d through libc's write: perf's DWARF unwinding of
    its stack copies gives the same frames as the kernel's walk."""
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed (linux-perf): no perf comparison")
    prog = private_copy(chain, tmp_path)
    theirs = [s for s in _perf_record(perf, "syscalls:sys_enter_write",
                                      [str(prog), "3", "write"], tmp_path)
              if any(dso == str(prog) for _sym, dso in s)]
    assert len(theirs) == 3
    (stack,) = counted("bpf", "syscall:write", "-c", f"{prog} 3 write")
    assert stack["count"] == 3 and stack["notes"] == []
    ours = _as_perf_shows(stack["frames"])
    for sample in theirs:
        # perf names objects by path, ustack by file name; perf stops at
        # main's caller chain as far as its copy reaches
        perfs = [(sym, os.path.basename(dso)) for sym, dso in sample]
        assert len(perfs) >= len(CHAIN) + 1
        assert len(perfs) <= len(ours)
        for theirs_frame, our_frame in zip(perfs, ours):
            assert _same_frame(theirs_frame, our_frame, prog), (perfs, ours)


def _same_frame(perfs: tuple, ours: tuple, prog: Path) -> bool:
    """One frame as both tools name it. Outside the program only the
    offset in the function is compared: libc's functions have aliases
    (write, __GI___libc_write), and perf labels some of its frames
    "(inlined)" (its srcline guess) where ustack names the module."""
    (sym, module), (our_sym, our_module) = perfs, ours
    if module == prog.name:
        return perfs == ours
    return sym.rpartition("+")[2] == our_sym.rpartition("+")[2] and \
        module in (our_module, "inlined")


# --- 3. profiles, libc callbacks, signals, C++, dlopen, Go ----------------------

WARMING = "the process's memory map was locked"   # see test_profile_*


NO_CFI = "no CFI covers this address"     # e.g. crt's __do_global_dtors_aux at exit
# ... which the walk now crosses on its frame pointer, saying so
THROUGH_NO_CFI = "frame pointer used for code without CFI"


def complete(stacks: list[dict]) -> list[dict]:
    """The stacks without notes; the others may only be the few samples
    cut while the kernel's VMA cache warms up (in a sample's interrupt,
    bpf_find_vma answers once, so a sample may meet one new mapping), or a
    sample of the exit path through start-up code that has no CFI."""
    cut = [s for s in stacks if s["notes"]]
    for s in cut:
        assert len(s["notes"]) == 1 and s["notes"][0].endswith((WARMING, NO_CFI,
                                                                THROUGH_NO_CFI)), s
    total = sum(s["count"] for s in stacks)
    # rare: ≤ 2 %, or one sample per 2 MiB region of code a walk meets first
    # (the program, libc's few, ld.so, the vDSO: a fresh CI run cut 4 of 199)
    assert sum(s["count"] for s in cut) <= max(8, total // 50), cut
    return [s for s in stacks if not s["notes"]]


def test_profile_user_mode_samples():
    busy = build("busy", flags=O2_NOFP)
    stacks = complete(counted("bpf", "profile", "-F", "199", "-c", f"{busy} 1"))
    top = max(stacks, key=lambda s: s["count"])
    assert names(top["frames"]) == ["spin_here", "work", "main", "__libc_start_call_main",
                                    "__libc_start_main", "_start"], top
    total = sum(s["count"] for s in stacks)
    for s in stacks:                 # in spin_here, or the vDSO clock it reads
        if "exit" in names(s["frames"]):     # sampled as main returned: its exit
            assert names(s["frames"])[-3:] == names(top["frames"])[-3:], s
            continue
        assert names(s["frames"])[-6:] == names(top["frames"]), s
    assert total >= 50


def test_profile_kernel_mode_samples(chain):
    """Samples that interrupt the kernel (inside write(2)) take the task's
    user registers: the stack is write's, down to _start."""
    stacks = complete(counted("bpf", "profile", "-F", "999",
                              "-c", f"{chain} 300000 write"))
    in_write = [s for s in stacks if names(s["frames"])[:2] == ["write", "d"]]
    assert in_write, stacks
    for s in in_write:
        assert names(s["frames"]) == ["write"] + CHAIN + [
            "__libc_start_call_main", "__libc_start_main", "_start"], s


def test_qsort_comparator_called_from_libc():
    prog = build("qsort_cb", flags=O2_NOFP)
    stacks = same_as_copy_path(f"uprobe:{prog}:cmp", "-c", f"{prog} 64")
    for s in stacks:
        own = [n for n, (_f, m) in zip(names(s["frames"]), s["frames"]) if m == prog.name]
        assert own == ["cmp", "sort_things", "main", "_start"], s
        assert s["frames"][1][1] == "libc.so.6"


def test_signal_handler_continues_into_interrupted_code():
    prog = build("sighandler", flags=O2_NOFP)
    stacks = counted("bpf", f"uprobe:{prog}:handler_leaf", "-c", f"{prog} 0.2")
    assert sum(s["count"] for s in stacks) == 20
    for s in stacks:
        assert s["notes"] == [], s
        # the signal frame between handler and spin, named at its exact pc
        assert names(s["frames"]) == ["handler_leaf", "handler", "__restore_rt", "spin",
                                      "main", "__libc_start_call_main",
                                      "__libc_start_main", "_start"], s
        assert s["frames"][2][1] == "libc.so.6"


def test_cxx_with_exceptions():
    from helpers import build_cxx
    prog = build_cxx("cxx_throw", O2_NOFP)
    (stack,) = same_as_copy_path(f"uprobe:{prog}:leaf", "-c", f"{prog} 4")
    assert names(stack["frames"])[:4] == ["leaf(long)", "f2(long)", "f1(long)", "main"]


def test_library_dlopened_after_attach():
    from helpers import run_attached, spawn, stop
    prog, plugin = build("dlopen_main", flags=O2_NOFP), build(
        "plugin", kind="shared", flags=O2_NOFP)
    target = spawn(prog, "-", plugin, 3, stdin=subprocess.PIPE)
    try:
        assert str(plugin) not in open(f"/proc/{target.pid}/maps").read()
        res = ok(run_attached(target, "count", "--backend", "bpf", "--unwind", "dwarf",
                              f"uprobe:{plugin}:plugin_leaf"))
        assert IN_KERNEL in res.stderr.splitlines()[0]
        (stack,) = parse_counts(res.stdout)
        assert stack["count"] == 3
        assert stack["frames"][:4] == [("plugin_leaf", "plugin.so"),
                                       ("plugin_entry", "plugin.so"),
                                       ("run_plugin", "dlopen_main"),
                                       ("main", "dlopen_main")], stack
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)


GO_CHAIN = ["main.d", "main.(*T).c", "main.b", "main.a", "main.main", "runtime.main",
            "runtime.goexit.abi0"]


GO_WRITER = """package main

import (
	"bufio"
	"os"
	"syscall"
)

var buf = []byte("x")
var fd int

//go:noinline
func d() { syscall.Write(fd, buf) }

//go:noinline
func c(n int) {
	for i := 0; i < n; i++ {
		d()
	}
}

//go:noinline
func b(n int) { c(n) }

//go:noinline
func a(n int) { b(n) }

func main() {
	fd, _ = syscall.Open("/dev/null", syscall.O_WRONLY, 0)
	bufio.NewReader(os.Stdin).ReadString('\\n')
	a(3)
}
"""


def test_go_uprobe():
    """Go has no .eh_frame: the rows come from .gopclntab's pcsp."""
    from helpers import build_go
    prog = build_go("gochain")
    (stack,) = same_as_copy_path(f"uprobe:{prog}:main.d", "-c", f"{prog} 3")
    assert names(stack["frames"]) == GO_CHAIN and stack["count"] == 3


def _attached(backend: str, argv: list, *args) -> list[dict]:
    """counted() on a target started first, waiting for a line on stdin."""
    from helpers import run_attached, spawn, stop
    target = spawn(*argv, stdin=subprocess.PIPE)
    try:
        res = ok(run_attached(target, "count", "--offsets", "--unwind", "dwarf",
                              "--backend", backend, *args))
        assert target.wait(timeout=10) == 0
    finally:
        stop(target)
    stacks = parse_counts(res.stdout)
    for s in stacks:
        s["notes"] = [f[1:-1] for f, m in s["frames"] if m is None and f.startswith("(")]
        s["frames"] = [(f, m) for f, m in s["frames"] if not (m is None and f.startswith("("))]
    return stacks


def test_go_syscall_frameless_assembly(tmp_path):
    """At the write syscall the frameless assembly syscall.RawSyscall6 is
    on the stack (a frame-pointer walk skips it)."""
    from helpers import build_go_source
    prog = build_go_source(tmp_path, GO_WRITER)
    kernel = _attached("bpf", [prog], "syscall:write")
    copied = _attached("perf", [prog], "syscall:write")
    (stack,) = kernel
    assert [(s["frames"], s["count"]) for s in copied] == [(stack["frames"], 3)]
    assert stack["notes"] == []
    assert names(stack["frames"]) == [
        "runtime/internal/syscall.Syscall6", "syscall.RawSyscall6", "syscall.Syscall",
        "syscall.write", "main.d", "main.c", "main.b", "main.a",
        "main.main", "runtime.main", "runtime.goexit.abi0"], stack


GO_LEAF = """package main

import (
	"os"
	"strconv"
	"time"
)

var sink int

//go:noinline
func leaf(x int) int {
	for j := 0; j < 50; j++ {
		x = x*3 + j
	}
	return x
}

//go:noinline
func work(until time.Time) {
	for time.Now().Before(until) {
		for i := 0; i < 10000; i++ {
			sink = leaf(sink)
		}
	}
}

func main() {
	ms, _ := strconv.Atoi(os.Args[1])
	work(time.Now().Add(time.Duration(ms) * time.Millisecond))
}
"""


def test_go_profile_frameless_leaf(tmp_path):
    """main.leaf keeps no frame: its samples still show main.work."""
    from helpers import build_go_source
    prog = build_go_source(tmp_path, GO_LEAF)
    stacks = counted("bpf", "profile", "-F", "499", "-c", f"{prog} 600")
    # Go's runtime also samples on its system stack (the scheduler after
    # runtime.mcall, timers): those may end with a note where the stack
    # switched (a known limit); they must stay rare, and main.leaf's whole
    total = sum(s["count"] for s in stacks)
    cut = sum(s["count"] for s in stacks if s["notes"])
    assert cut <= max(8, total // 50), [s for s in stacks if s["notes"]]   # as complete()
    in_leaf = [s for s in stacks if names(s["frames"])[0] == "main.leaf"]
    assert sum(s["count"] for s in in_leaf) > 20, stacks
    for s in in_leaf:
        assert not s["notes"] and names(s["frames"]) == [
            "main.leaf", "main.work", "main.main", "runtime.main", "runtime.goexit.abi0"], s


GO_CLOCK = """package main

import (
	"os"
	"strconv"
	"time"
)

var sink int64

//go:noinline
func stamp() int64 { return time.Now().UnixNano() }

//go:noinline
func work(until time.Time) {
	for time.Now().Before(until) {
		for i := 0; i < 100; i++ {
			sink += stamp()
		}
	}
}

func main() {
	ms, _ := strconv.Atoi(os.Args[1])
	work(time.Now().Add(time.Duration(ms) * time.Millisecond))
}
"""


def test_go_vdso_call_on_the_system_stack(tmp_path):
    """time.now moves rsp to the thread's system stack to call the vDSO:
    its frame is followed on rbp (its rsp-based rule would read the other
    stack) down to the goroutine's first frame, in the kernel's walk of the
    stack (before: 684 of 789 samples ended at an address in no mapping).
    A sample the kernel could not walk (its memory map locked) is unwound
    by ustack from its stack copy, which holds only the system stack: that
    one is cut, with a note."""
    from helpers import build_go_source
    prog = build_go_source(tmp_path, GO_CLOCK)
    stacks = counted("bpf", "profile", "-F", "499", "-c", f"{prog} 600")
    in_vdso = [s for s in stacks if s["frames"] and s["frames"][0][1] == "vdso"]
    whole = [s for s in in_vdso if not s["notes"]]
    assert sum(s["count"] for s in whole) >= 5, stacks
    assert sum(s["count"] for s in whole) >= 0.9 * sum(s["count"] for s in in_vdso), stacks
    for s in whole:
        assert names(s["frames"])[:2] == ["clock_gettime", "time.now"], s
        assert names(s["frames"])[-4:] == [
            "main.work", "main.main", "runtime.main", "runtime.goexit.abi0"], s


# --- 4. what the user is told ---------------------------------------------------

def test_jit_code_is_walked_on_its_frame_pointer_with_a_note():
    """Code in anonymous memory has no unwind rows: the kernel's walk goes
    on through it on its frame pointer, as the copy path's unwinder does,
    to the same whole stack (JIT frames named from the perf map), and says
    so on the stack; nothing was cut short."""
    prog = build("jit", flags=O2_NOFP)
    args = ("--unwind", "dwarf", f"uprobe:{prog}:target", "-c", f"{prog} 2")
    res = ok(run_ustack("count", "--backend", "bpf", *args))
    copied = ok(run_ustack("count", "--backend", "perf", *args))
    stacks = parse_counts(res.stdout)
    assert len(stacks) == 2 and all(s["count"] == 2 for s in stacks), res.stdout
    note = ("(frame pointer used for code without a file (JIT?))", None)
    by_frames = lambda stack: stack["frames"]                  # noqa: E731 (equal counts)
    for s, c in zip(sorted(stacks, key=by_frames),
                    sorted(parse_counts(copied.stdout), key=by_frames)):
        assert s["frames"][-1] == note, s
        assert s["frames"][:-1] == c["frames"][:-1], (s, c)       # the copy path's note differs
        assert [f for f, _m in s["frames"][:3]][0::2] == ["target", "main"], s
        assert s["frames"][1][1] == "JIT" and s["frames"][-2][0] == "_start", s
    assert "cut short" not in res.stderr, res.stderr


def test_jit_code_of_a_process_without_a_jvm_is_walked_in_the_kernel():
    """Only a JVM's JIT code (no frame pointer in its compiled code) is
    handed to ustack with a copy of the stack: another JIT's (this one
    calls through it from a 16 KiB frame, deeper than a copy of its
    untouched stack reaches) is walked in the kernel on its frame pointer,
    complete to _start, and no stack is said to be walked from copies."""
    prog = build("jit", flags=O2_NOFP)
    res = ok(run_ustack("count", "--backend", "bpf", "--unwind", "dwarf",
                        f"uprobe:{prog}:target", "-c", f"{prog} 2 0 16"))
    stacks = parse_counts(res.stdout)
    assert len(stacks) == 2 and all(s["count"] == 2 for s in stacks), res.stdout
    for s in stacks:
        assert names(s["frames"])[:-1] == [
            "target", names(s["frames"])[1], "call_through", "main", "__libc_start_call_main",
            "__libc_start_main", "_start"], s
        assert s["frames"][1][1] == "JIT", s
        assert s["frames"][-1] == ("(frame pointer used for code without a file (JIT?))", None), s
    assert "JVM" not in res.stderr and "cut short" not in res.stdout, res


def test_auto_unwinds_in_the_kernel_frame_pointers_only_when_asked(chain):
    res = ok(run_ustack("profile", "-F", "99", "-c", f"{chain} 1"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    res = ok(run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 1"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    fp = build("chain")              # frame pointers kept: walked only when asked
    res = ok(run_ustack("count", f"uprobe:{fp}:d", "-c", f"{fp} 1"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    res = ok(run_ustack("count", "--unwind", "fp", f"uprobe:{fp}:d", "-c", f"{fp} 1"))
    assert "[backend bpf, unwind fp]" in res.stderr.splitlines()[0]


def test_refused_program_falls_back_to_the_copy_path_and_says_why(chain, monkeypatch):
    """Where the kernel refuses the unwinder, the copy path runs, and the
    note carries the verifier's words."""
    from ustack.capture import bpf_unwind
    from ustack.probes.events import resolve_probes
    from ustack.probes.spec import parse_event
    from ustack import plan as policy
    refusal = ("the kernel refused BPF program ustack_uwtry: Invalid argument\n"
               "R1 type=scalar expected=fp")
    monkeypatch.setattr(bpf_unwind, "why_unavailable", lambda probes: refusal)
    probes = resolve_probes([parse_event(f"uprobe:{chain}:d")], None)
    plan = policy.plan("count", "auto", "dwarf", probes, str(chain))
    assert (plan.backend, plan.modes, plan.kernel_tables) == ("perf", ("dwarf",), None)
    assert plan.note == ("in-kernel DWARF unwinding failed to load: " + refusal +
                         "; stacks are copied and unwound by ustack")
    auto = policy.plan("count", "auto", "auto", probes, str(chain))
    assert auto.backend == "perf" and auto.note == plan.note


def test_kernel_frames_above_the_dwarf_stack(chain):
    """--kernel: the kernel's frames (bpf_get_stackid), then the user stack
    the program unwound, through libc's write."""
    res = ok(run_ustack("count", "--kernel", "--unwind", "dwarf", "syscall:write",
                        "-c", f"{chain} 4 write"))
    assert IN_KERNEL in res.stderr.splitlines()[0]
    (stack,) = parse_counts(res.stdout)
    mods = [m for _f, m in stack["frames"]]
    sep = mods.index(None)
    assert stack["frames"][sep][0] == "--" and set(mods[:sep]) == {"kernel"}
    assert [f for f, _m in stack["frames"][sep + 1:sep + 7]] == ["write"] + CHAIN
    assert stack["count"] == 4


def test_dynamic_loader_startup_ends_cleanly():
    """ld.so's _start has no CFI and rbp 0 (the ABI's outermost mark): the
    stacks of its syscalls end there complete, with no note, as the copy
    path's do."""
    stacks = same_as_copy_path("syscall:mmap", "-c", "true")
    loader = [s for s in stacks if s["frames"][-1][1].startswith("ld-linux")]
    assert loader and {names(s["frames"])[-1] for s in loader} == {"_start"}
