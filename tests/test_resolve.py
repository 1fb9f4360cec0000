"""resolve_uprobes / tracepoint_probes / listing on real binaries; objdump,
readelf and nm are the oracles for instructions, addresses and offsets."""
import os
import re
import shutil
import subprocess

import pytest

from helpers import build_go_source, wait_until

from ustack.kernel.tracefs import tracepoint_groups, tracepoint_names
from ustack.model import UstackError
from ustack.probes import resolve
from ustack.commands.list import format_listing, list_functions
from ustack.probes.resolve import resolve_uprobes, tracepoint_probes
from ustack.probes.spec import parse_event

SRC = r"""
#include <stdio.h>
#include <stdlib.h>
int counter = 3;
__attribute__((noinline)) int leaf(int x) { return x * 3 + counter; }
__attribute__((noinline)) long work(long n) {
    char buf[64];
    long s = 0;
    for (long i = 0; i < n; i++) {
        snprintf(buf, sizeof buf, "%ld", i);
        s += atoi(buf) + leaf(i);
    }
    return s;
}
__attribute__((noinline)) static int impl(int x) { return x ^ counter; }
int alias_one(int x) __attribute__((alias("impl")));
int alias_two(int x) __attribute__((alias("impl")));

/* prologues with known shapes (never called) */
__attribute__((naked)) void saves(void) {
    asm("push %r12\n push %rbx\n sub $0x18,%rsp\n nop\n"
        "add $0x18,%rsp\n pop %rbx\n pop %r12\n ret");
}
__attribute__((naked)) void gostyle(void) {
    asm("sub $0x18,%rsp\n mov %rbp,0x10(%rsp)\n lea 0x10(%rsp),%rbp\n nop\n"
        "mov 0x10(%rsp),%rbp\n add $0x18,%rsp\n ret");
}
__attribute__((naked)) void branchy(void) {
    asm("test %rdi,%rdi\n je 1f\n push %rbx\n pop %rbx\n1: nop\n ret");
}
__attribute__((naked)) void realign(void) {
    asm("push %rbx\n and $-16,%rsp\n nop\n ret");
}
int main(int argc, char **argv) {
    printf("%ld %d\n", work(argc * 10), alias_one(argc));
    return 0;
}
"""


def run(*cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def cc(d, name, *flags):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    (d / "prog.c").write_text(SRC)
    out = d / name
    run("gcc", *flags, "-o", str(out), str(d / "prog.c"))
    return str(out)


def nm(path):
    """{name: address} of defined symbols."""
    out = {}
    for line in run("nm", "--defined-only", path).splitlines():
        addr, _kind, name = line.split(" ", 2)
        out[name] = int(addr, 16)
    return out


def nm_sizes(path):
    out = {}
    for line in run("nm", "-S", "--defined-only", path).splitlines():
        f = line.split(" ")
        if len(f) == 4:
            out[f[3]] = int(f[1], 16)
    return out


def insns(path, func):
    """[(offset in func, 'mnemonic operands')] from objdump, intel syntax."""
    start = nm(path)[func]
    out, inside = [], False
    for line in run("objdump", "-d", "--no-show-raw-insn", "-M", "intel", path).splitlines():
        if re.match(r"^[0-9a-f]+ <", line):
            inside = line.endswith(f"<{func}>:")
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if inside and m:
            text = re.sub(r"\s+<.*>$", "", m.group(2))
            out.append((int(m.group(1), 16) - start, " ".join(text.split())))
    return out


def after(path, func, text):
    """Offset of the instruction following the first one spelled `text`."""
    listing = insns(path, func)
    i = [t for _o, t in listing].index(text)
    return listing[i + 1][0]


def one(text, pid=None):
    (target,) = resolve_uprobes(parse_event(text), pid)
    return target


def slot(path, func, off):
    return one(f"uprobe:{path}:{func}+{off}").return_address_slot


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    d = tmp_path_factory.mktemp("resolve")
    return {
        "o0": cc(d, "o0", "-O0", "-fno-omit-frame-pointer", "-fPIE", "-pie"),
        "o2": cc(d, "o2", "-O2", "-fomit-frame-pointer", "-no-pie"),
        "so": cc(d, "libprog.so", "-O2", "-shared", "-fPIC"),
    }


# --- targets ----------------------------------------------------------------

def test_target_fields_nopie(bins):
    path = bins["o2"]
    t = one(f"uprobe:{path}:work")
    work = nm(path)["work"]
    load = [l.split() for l in run("readelf", "-lW", path).splitlines()
            if l.split()[:1] == ["LOAD"] and "E" in l.split()[6:-1]][0]
    assert work > 0x400000
    assert t.file_offset == work - int(load[2], 16) + int(load[1], 16)
    assert (t.path, t.address, t.symbol, t.symbol_offset) == (path, work, "work", 0)
    assert t.return_address_slot == 0
    assert t.label == f"uprobe:{path}:work"
    assert t.spec.text == f"uprobe:{path}:work"


def test_target_through_symlink_and_shared_lib(bins, tmp_path):
    link = tmp_path / "link.so"
    link.symlink_to(bins["so"])
    t = one(f"uprobe:{link}:leaf")
    assert t.path == os.path.realpath(bins["so"]) and t.label == f"uprobe:{t.path}:leaf"
    assert t.address == nm(bins["so"])["leaf"]
    assert t.file_offset == t.address  # this .so's text segment has vaddr == offset


def test_glob_gives_one_target_per_address(bins):
    path = bins["o2"]
    targets = resolve_uprobes(parse_event(f"uprobe:{path}:alias_*"))
    assert len(targets) == 1
    assert targets[0].symbol == "alias_one"  # a global name, not the local `impl`
    assert targets[0].address == nm(path)["impl"]
    everything = resolve_uprobes(parse_event(f"uprobe:{path}:*"))
    addrs = [t.address for t in everything]
    assert len(addrs) == len(set(addrs)) and nm(path)["work"] in addrs
    assert [t.symbol for t in resolve_uprobes(parse_event(f"uprobe:{path}:w*"))] == ["work"]


def test_address_spec(bins):
    path = bins["o2"]
    work = nm(path)["work"]
    second = insns(path, "work")[1][0]
    t = one(f"uprobe:{path}:0x{work + second:x}")
    assert (t.symbol, t.symbol_offset, t.address) == ("work", second, work + second)
    assert t.label == f"uprobe:{path}:work+0x{second:x}"
    counter = nm(path)["counter"]
    with pytest.raises(UstackError, match=rf"^0x{counter:x} is not in the code of {path}$"):
        one(f"uprobe:{path}:0x{counter:x}")


def test_uretprobe_on_c(bins):
    p = bins["o2"]
    t = one(f"uretprobe:{p}:leaf")
    assert t.spec.kind == "uretprobe" and t.label == f"uretprobe:{p}:leaf"
    assert one(f"uretprobe:{p}:0x{t.address:x}").symbol == "leaf"
    # it fires after the return: no entry-slot word to recover
    assert t.return_address_slot is None
    second = insns(p, "leaf")[1][0]
    with pytest.raises(UstackError) as e:
        one(f"uretprobe:{p}:0x{t.address + second:x}")
    assert str(e.value) == ("a uretprobe must be on a function's entry, and "
                            f"0x{t.address + second:x} is leaf+0x{second:x}")
    with pytest.raises(ValueError):
        resolve_uprobes(parse_event("syscall:write"))


# --- return_address_slot on real prologues ---------------------------------------

def test_slot_gcc_O0_frame_pointer(bins):
    p = bins["o0"]
    assert insns(p, "work")[:2] == [(0, "push rbp"), (1, "mov rbp,rsp")]
    assert slot(p, "work", 0) == 0
    assert slot(p, "work", after(p, "work", "push rbp")) == 1
    assert slot(p, "work", after(p, "work", "mov rbp,rsp")) is None


def test_slot_gcc_O2_no_frame_pointer(bins):
    p = bins["o2"]
    listing = insns(p, "work")
    assert listing[0][1].startswith("push ")
    assert slot(p, "work", listing[1][0]) == 1
    # after the whole prologue (pushes, then sub rsp): every word counts
    texts = [t for _o, t in listing]
    sub = next(i for i, t in enumerate(texts) if t.startswith("sub rsp,"))
    pushes = sum(t.startswith("push ") for t in texts[:sub])
    frame = int(texts[sub].split(",")[1], 16)
    assert pushes >= 1 and frame % 8 == 0
    assert slot(p, "work", listing[sub + 1][0]) == pushes + frame // 8


def test_slot_known_shapes(bins):
    p = bins["o2"]
    assert slot(p, "saves", after(p, "saves", "push r12")) == 1
    assert slot(p, "saves", after(p, "saves", "push rbx")) == 2
    assert slot(p, "saves", after(p, "saves", "sub rsp,0x18")) == 5
    # Go's frame: sub rsp; mov [rsp+X],rbp; lea rbp,[rsp+X]
    assert slot(p, "gostyle", after(p, "gostyle", "sub rsp,0x18")) == 3
    assert slot(p, "gostyle", after(p, "gostyle", "mov QWORD PTR [rsp+0x10],rbp")) == 3
    assert slot(p, "gostyle", after(p, "gostyle", "lea rbp,[rsp+0x10]")) is None
    # reached both by falling through and by a jump: unknown
    assert slot(p, "branchy", after(p, "branchy", "pop rbx")) is None
    assert slot(p, "branchy", after(p, "branchy", "push rbx")) == 1
    # rsp realigned: unknown
    assert slot(p, "realign", after(p, "realign", "push rbx")) == 1
    assert slot(p, "realign", after(p, "realign", "and rsp,0xfffffffffffffff0")) is None


GO_SRC = """package main

import (
	"fmt"
	"os"
)

type T struct{ n int }

//go:noinline
func (t *T) Method(x int) int { return t.n*x + len(os.Args) }

//go:noinline
func work(n int) int {
	t := &T{n}
	s := 0
	for i := 0; i < n; i++ {
		s += t.Method(i)
	}
	return s
}

func main() { fmt.Println(work(10)) }
"""


@pytest.fixture(scope="module")
def gobin(tmp_path_factory):
    return build_go_source(tmp_path_factory.mktemp("go"), GO_SRC)


def test_slot_go(gobin):
    listing = insns(gobin, "main.work")
    texts = [t for _o, t in listing]
    sub = next(i for i, t in enumerate(texts) if t.startswith("sub rsp,"))
    lea = next(i for i, t in enumerate(texts) if t.startswith("lea rbp,[rsp"))
    frame = int(texts[sub].split(",")[1], 16)
    assert slot(gobin, "main.work", 0) == 0
    assert slot(gobin, "main.work", listing[sub][0]) == 0  # after the stack check
    assert slot(gobin, "main.work", listing[sub + 1][0]) == frame // 8
    assert slot(gobin, "main.work", listing[lea + 1][0]) is None
    t = one(f"uprobe:{gobin}:main.(*T).Method")
    assert t.symbol == "main.(*T).Method" and t.label == f"uprobe:{gobin}:main.(*T).Method"


def test_go_uretprobe_is_a_uprobe_on_each_ret(gobin):
    """A uretprobe would crash Go: a uretprobe on a Go function becomes a
    plain uprobe on each of its RET instructions (objdump's), named as the
    uretprobe, with the return address at [sp]; $retval is rax there."""
    probes = resolve_uprobes(parse_event(f"uretprobe:{gobin}:main.work r=$retval"))
    rets = [o for o, t in insns(gobin, "main.work") if t == "ret"]
    assert rets and [p.symbol_offset for p in probes] == rets
    start = nm(gobin)["main.work"]
    for p in probes:
        assert p.spec.kind == "uprobe" and p.label == f"uretprobe:{gobin}:main.work"
        assert p.address == start + p.symbol_offset and p.return_address_slot == 0
        assert p.fetch_args == ("r=%ax",)


# --- errors ---------------------------------------------------------------------

def test_errors(bins, tmp_path):
    p = bins["o2"]

    def error(text):
        with pytest.raises(UstackError) as e:
            resolve_uprobes(parse_event(text))
        return str(e.value)

    assert error("uprobe:/nonexistent/bin:main") == "no such binary or library: /nonexistent/bin"
    assert error("uprobe:nosuchlib_xyz:main") == "no such binary or library: nosuchlib_xyz"
    assert error(f"uprobe:{p}:wrok") == f"no function 'wrok' in {p}; did you mean: work?"
    assert error(f"uprobe:{p}:qqqqqqqq") == f"no function 'qqqqqqqq' in {p}"
    assert error(f"uprobe:{p}:zz*") == f"no function matches 'zz*' in {p}"
    size = nm_sizes(p)["work"]
    assert error(f"uprobe:{p}:work+{size}") == (
        f"work+0x{size:x} is beyond the end of work (size 0x{size:x}) in {p}")
    assert error(f"uprobe:{p}:saves+1") == (
        f"saves+0x1 in {p} is not on an instruction boundary "
        "(inside 'push r12' at saves+0x0)")
    stripped = str(tmp_path / "stripped")
    run("strip", "--strip-all", "-o", stripped, p)
    assert error(f"uprobe:{stripped}:work") == (
        f"no function 'work' in {stripped} ({stripped} has no symbol table)")
    text = tmp_path / "script"
    text.write_text("#!/bin/sh\n")
    assert error(f"uprobe:{text}:main") == f"{text}: not an ELF file"


def test_every_instruction_boundary(bins):
    """Walk `work` byte by byte: exactly objdump's instruction starts are accepted."""
    p = bins["o2"]
    starts = {o for o, _t in insns(p, "work")}
    size = nm_sizes(p)["work"]
    for off in range(1, min(size, 48)):
        try:
            one(f"uprobe:{p}:work+{off}")
            assert off in starts, off
        except UstackError as e:
            assert off not in starts and "not on an instruction boundary" in str(e)


# --- finding binaries by name, by pid, in another root ---------------------------

def ldconfig_path(soname):
    for line in run("ldconfig", "-p").splitlines():
        if line.strip().startswith(soname + " ") and "x86-64" in line:
            return line.split(" => ")[1].strip()
    pytest.skip(f"ldconfig does not know {soname}")


def test_bare_library_names():
    libc = os.path.realpath(ldconfig_path("libc.so.6"))
    for name in ("libc", "c", "libc.so.6"):
        t = one(f"uprobe:{name}:getpid")
        assert t.path == libc and t.label == f"uprobe:{libc}:getpid"


def test_library_of_a_process():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        # the dynamic loader maps libc just after exec, its code after its
        # first read-only part: wait for the code
        wait_until(lambda: any("/libc.so" in line and line.split()[1].startswith("r-x")
                               for line in open(f"/proc/{proc.pid}/maps")),
                   what="libc's code in the maps of `sleep 30`")
        maps = open(f"/proc/{proc.pid}/maps").read()
        libc = next(l.split()[-1] for l in maps.splitlines() if "/libc.so" in l)
        t = one("uprobe:libc:getpid", pid=proc.pid)
        assert t.path == libc and t.label == f"uprobe:{libc}:getpid"
        with pytest.raises(UstackError, match="^no such binary or library: libzzz$"):
            one("uprobe:libzzz:f", pid=proc.pid)
        # an absolute path with a pid; sleep is stripped: probe its entry point
        sleep = os.path.realpath(shutil.which("sleep"))
        entry = int(re.search(r"Entry point address:\s+(0x[0-9a-f]+)",
                              run("readelf", "-h", sleep)).group(1), 16)
        t = one(f"uprobe:{sleep}:0x{entry:x}", pid=proc.pid)
        assert (t.path, t.symbol, t.symbol_offset, t.return_address_slot) == (sleep, None, 0, None)
        assert t.label == f"uprobe:{sleep}:0x{entry:x}"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(UstackError, match=rf"^no such process: {proc.pid}$"):
        one("uprobe:libc:getpid", pid=proc.pid)


def test_symlinks_resolve_inside_another_root(tmp_path):
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/real.so").write_bytes(b"")
    (root / "lib").symlink_to("usr/lib")
    (root / "usr/lib/libx.so").symlink_to("/usr/lib/real.so")  # absolute: inside root
    (root / "usr/lib/up").symlink_to("../../../../..")
    assert resolve.realpath_in_root(str(root), "/lib/libx.so") == "/usr/lib/real.so"
    assert resolve.realpath_in_root(str(root), "/usr/lib/up/lib/./libx.so") == "/usr/lib/real.so"


def test_process_in_another_root(tmp_path):
    """A chrooted process: its paths are opened through /proc/PID/root, and its
    absolute symlinks are followed inside that root."""
    if shutil.which("chroot") is None:
        pytest.skip("chroot is not installed")
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "st.c").write_text("#include <unistd.h>\nint main(void) { sleep(30); return 0; }\n")
    try:
        run("gcc", "-static", "-O1", "-o", str(root / "usr/bin/st"), str(root / "st.c"))
    except subprocess.CalledProcessError:
        pytest.skip("gcc cannot link statically (no libc.a)")
    (root / "bin").symlink_to("/usr/bin")  # absolute: means ROOT/usr/bin in there
    proc = subprocess.Popen(["chroot", str(root), "/bin/st"])
    try:
        # chroot execs st: wait until it has
        wait_until(lambda: os.readlink(f"/proc/{proc.pid}/exe").endswith("/st"),
                   what="chroot's exec of /bin/st")
        t = one("uprobe:/bin/st:main", pid=proc.pid)
        assert t.path == f"/proc/{proc.pid}/root/usr/bin/st"
        assert t.label == "uprobe:/usr/bin/st:main"
        assert t.address == nm(str(root / "usr/bin/st"))["main"]
        # by name, from its maps (which show a chroot's paths from our root)
        t = one("uprobe:st:main", pid=proc.pid)
        assert os.path.samefile(t.path, root / "usr/bin/st") and t.label.endswith("/usr/bin/st:main")
        with pytest.raises(UstackError, match="^no such binary or library: /bin/nothing$"):
            one("uprobe:/bin/nothing:main", pid=proc.pid)
    finally:
        proc.kill()
        proc.wait()


# --- tracepoints ----------------------------------------------------------------

@pytest.fixture(scope="module")
def events():
    from ustack.kernel.tracefs import tracefs_root
    try:
        root = tracefs_root()
    except UstackError as e:
        pytest.skip(f"kernel lacks tracefs: {e}")
    path = os.path.join(root, "events")
    if not os.path.isdir(os.path.join(path, "syscalls")):
        pytest.skip("kernel lacks syscall tracepoints (CONFIG_FTRACE_SYSCALLS)")
    return path


def tp(text):
    return [(t.group, t.name, t.label) for t in tracepoint_probes(parse_event(text))]


def test_syscall_targets(events):
    assert tp("syscall:write") == [("syscalls", "sys_enter_write", "syscall:write")]
    reads = tp("syscall:read*")
    assert ("syscalls", "sys_enter_read", "syscall:read") in reads
    assert all(label.startswith("syscall:read") for _g, _n, label in reads)
    enters = [e for e in os.listdir(os.path.join(events, "syscalls"))
              if e.startswith("sys_enter_")]
    assert len(tp("syscall:*")) == len(enters)


def test_tracepoint_targets(events):
    assert tp("tracepoint:syscalls:sys_enter_write") == [
        ("syscalls", "sys_enter_write", "tracepoint:syscalls:sys_enter_write")]
    if os.path.isdir(os.path.join(events, "sched", "sched_switch")):
        assert ("sched", "sched_switch", "tracepoint:sched:sched_switch") in tp("t:sched:sched_s*")


def test_tracefs_lists_groups_and_names(events):
    """kernel.tracefs lists events/GROUP/NAME directories, not its files."""
    groups = tracepoint_groups()
    assert "syscalls" in groups and "enable" not in groups and groups == sorted(groups)
    names = tracepoint_names("syscalls")
    assert "sys_enter_write" in names and "enable" not in names
    assert names == sorted(e.name for e in os.scandir(os.path.join(events, "syscalls"))
                           if e.is_dir())
    assert tracepoint_names("no_such_group") == []


def test_tracepoint_errors(events):
    def error(text):
        with pytest.raises(UstackError) as e:
            tracepoint_probes(parse_event(text))
        return str(e.value)

    assert error("syscall:wrte").startswith("no syscall matches 'wrte'; did you mean: write")
    assert error("syscall:zz*") == "no syscall matches 'zz*'"
    assert error("tracepoint:syscalls:sys_enter_wrte").startswith(
        "no tracepoint matches 'syscalls:sys_enter_wrte'; did you mean: syscalls:sys_enter_write")
    assert error("tracepoint:nogroup*:x") == "no tracepoint matches 'nogroup*:x'"
    with pytest.raises(ValueError):
        tracepoint_probes(parse_event("profile:hz:99"))


# --- listing --------------------------------------------------------------------

def test_list_functions(bins):
    p = bins["o2"]
    rows = list_functions(p)
    sizes, addrs = nm_sizes(p), nm(p)
    by_name = {r.name: r for r in rows}
    for name in ("work", "leaf", "main", "alias_one", "impl", "saves"):
        r = by_name[name]
        assert (r.address, r.size, r.file_offset) == (addrs[name], sizes[name], addrs[name] - 0x400000)
    assert [r.name for r in list_functions(p, "alias_*")] == ["alias_one", "alias_two"]
    with pytest.raises(UstackError, match=rf"^no function matches 'zz\*' in {p}$"):
        list_functions(p, "zz*")
    with pytest.raises(UstackError, match=rf"^no function 'wrok' in {p}; did you mean: work\?$"):
        list_functions(p, "wrok")


def test_format_listing(bins):
    rows = list_functions(bins["o2"], "[lw]*")
    text = format_listing(rows)
    lines = text.splitlines()
    assert lines[0].split() == ["ADDRESS", "OFFSET", "SIZE", "FUNCTION"]
    col = lines[0].index("FUNCTION")
    assert len(lines) == 1 + len(rows) == 3
    for line, r in zip(lines[1:], rows):
        assert line[col:] == r.name
        assert line[:col].split() == [f"{r.address:x}", f"{r.file_offset:x}", f"{r.size:x}"]
