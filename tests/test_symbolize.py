"""`ustack symbolize`: ftrace output captured here through tracefs with the
classic recipe (a syscall event, the userstacktrace option, in an instance of
our own), with and without sym-userobj, named back to main -> a -> b -> c -> d.
And bad input: garbage lines pass through, a bad maps file is one message."""
import contextlib
import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import O2_FP, addr2line_chains, build, run_ustack, ustack_env, wait_until

from ustack.objfile import content_key
from ustack.objfile.elf import ElfImage

TRACEFS = Path("/sys/kernel/tracing")
CHAIN = ["d", "c", "b", "a", "main"]


def write(path: Path, text: str) -> None:
    path.write_text(text)


@contextlib.contextmanager
def traced_chain(prog, sym_userobj: bool):
    """Runs `chain BIG rawwrite` (d makes the write syscall itself, so the
    frame-pointer walk starts in d), records sys_enter_write with the
    userstacktrace option in a tracefs instance, and yields (pid, trace
    text, saved maps text) while the process still runs: the kernel names
    sym-userobj files only while the process exists. Everything is removed
    afterwards."""
    inst = TRACEFS / "instances" / f"ustack_{os.getpid()}_x"
    proc = subprocess.Popen([str(prog), "1000000000", "rawwrite"])
    try:
        inst.mkdir()
        try:
            write(inst / "buffer_size_kb", "64")
            write(inst / "set_event_pid", str(proc.pid))
            write(inst / "options" / "userstacktrace", "1")
            write(inst / "options" / "sym-userobj", "1" if sym_userobj else "0")
            write(inst / "events" / "syscalls" / "sys_enter_write" / "enable", "1")
            # check_chain wants 5 complete stacks: wait for 10 recorded
            wait_until(lambda: (inst / "trace").read_text().count("<user stack trace>") >= 10,
                       what="10 user stacks in the instance's trace")
            write(inst / "tracing_on", "0")
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            trace = (inst / "trace").read_text()
            yield proc.pid, trace, maps
        finally:
            with contextlib.suppress(OSError):
                write(inst / "events" / "syscalls" / "sys_enter_write" / "enable", "0")
            inst.rmdir()
    finally:
        proc.kill()
        proc.wait()


def user_stacks(text: str) -> list:
    """The frame labels of each `<user stack trace>` block of symbolize's output."""
    stacks, current = [], None
    for line in text.splitlines():
        if "<user stack trace>" in line:
            current = []
            stacks.append(current)
        elif current is not None and line.lstrip().startswith("=>"):
            current.append(line.split(" : ", 1)[1] if " : " in line else None)
        else:
            current = None
    return [s for s in stacks if s]


def names(stack) -> list:
    return [re.split(r"[+ ]", label, 1)[0] if label else None for label in stack]


def check_chain(output: str, least: int = 5):
    stacks = user_stacks(output)
    full = [s for s in stacks if len(s) >= 5]
    assert full, output[:2000]
    for s in full:
        assert names(s)[:5] == CHAIN
    assert len(full) >= least


@pytest.fixture
def prog():
    return build("chain", flags=O2_FP)


@pytest.mark.kernel
@pytest.mark.parametrize("sym_userobj", [False, True], ids=["nosym-userobj", "sym-userobj"])
def test_symbolize_captured_trace(prog, tmp_path, sym_userobj):
    with traced_chain(prog, sym_userobj) as (pid, trace, maps):
        (tmp_path / "trace").write_text(trace)
        (tmp_path / "maps").write_text(maps)
        live = run_ustack("symbolize", tmp_path / "trace", "--pid", pid)
    frame_lines = [l for l in trace.splitlines() if l.startswith(" => ")]
    if sym_userobj:
        assert all(re.fullmatch(r" => /\S+\[\+0x[0-9a-f]+\]", l) for l in frame_lines)
    else:
        assert all(re.fullmatch(r" =>  <[0-9a-f]{16}>", l) for l in frame_lines)
    assert live.returncode == 0 and live.stderr == ""
    check_chain(live.stdout)
    # the process is gone: its saved maps still name every frame
    saved = run_ustack("symbolize", tmp_path / "trace", "--maps", tmp_path / "maps")
    assert saved.returncode == 0 and saved.stderr == ""
    assert saved.stdout == live.stdout
    # every other line is passed through as it was
    others = [l for l in trace.splitlines() if not l.startswith(" => ")]
    assert [l for l in saved.stdout.splitlines() if not l.startswith(" => ")] == others
    libc = [s[5] for s in user_stacks(saved.stdout) if len(s) > 5]
    assert libc and all(l.startswith("__libc_start_call_main+") and l.endswith("[libc.so.6]")
                        for l in libc)


@pytest.mark.kernel
def test_symbolize_lines_and_inlines(prog, tmp_path):
    """--lines/--inlines reach the command: each frame's file:line is what
    eu-addr2line says (the leaf at its address, return addresses at -1).
    The command leaves at once after its output (os._exit) but keeps its
    answers first: a second run finds them in the cache, private, and
    prints the same."""
    with traced_chain(prog, False) as (_pid, trace, maps):
        (tmp_path / "trace").write_text(trace)
        (tmp_path / "maps").write_text(maps)
    env = dict(ustack_env(), USTACK_CACHE_DIR=str(tmp_path / "cache"))
    args = ("symbolize", tmp_path / "trace", "--maps", tmp_path / "maps",
            "--lines", "--inlines")
    res = run_ustack(*args, env=env)
    assert res.returncode == 0, res.stderr
    kept = tmp_path / "cache" / "lines" / f"{content_key.of_dwarf(os.stat(prog), None)}.memo1.json"
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    again = run_ustack(*args, env=env)
    assert (again.returncode, again.stdout) == (0, res.stdout)
    block = next(b for b in re.split(r"\n(?=.*<user stack trace>)", res.stdout)
                 if b.count("\n =>") >= 6)
    lines = [l for l in block.splitlines() if l.startswith(" =>")][:5]
    text = next(l for l in maps.splitlines() if " r-xp " in l and l.endswith(str(prog)))
    start, pgoff = int(text.split("-")[0], 16), int(text.split()[2], 16)
    image = ElfImage.open(str(prog))
    vaddrs = [image.vaddr_of_file_offset(int(re.search(r"<([0-9a-f]+)>", l).group(1), 16)
                                         - start + pgoff) - (i > 0)
              for i, l in enumerate(lines)]
    oracle = addr2line_chains("eu-addr2line", prog, vaddrs)
    assert [oracle[v] for v in vaddrs] == [[(fn, file, int(line))] for fn, file, line in
                                           (re.search(r" : (\w+)\+0x\S+ \[chain\] (\S+):(\d+)$",
                                                      l).groups() for l in lines)]
    assert [oracle[v][0][0] for v in vaddrs] == CHAIN


@pytest.mark.kernel
def test_symbolize_binary_non_pie(tmp_path):
    """--binary: absolute addresses are the non-PIE program's own."""
    prog = build("chain", flags=O2_FP, pie=False)
    with traced_chain(prog, False) as (_pid, trace, _maps):
        (tmp_path / "trace").write_text(trace)
    res = run_ustack("symbolize", tmp_path / "trace", "--binary", prog)
    assert res.returncode == 0 and res.stderr == ""
    check_chain(res.stdout)
    # a PIE binary's absolute addresses cannot be placed: said once, not guessed
    pie = build("chain", flags=O2_FP)
    res = run_ustack("symbolize", tmp_path / "trace", "--binary", pie)
    assert res.returncode == 0
    assert res.stderr == (f"ustack: {pie} is position-independent: its absolute addresses "
                          "cannot be named without --pid or --maps (sym-userobj's "
                          "FILE[+0xOFF] frames can)\n")
    assert all(label.startswith("[unknown]") for s in user_stacks(res.stdout) for label in s)


def test_symbolize_sym_userobj_without_maps(prog, tmp_path):
    """FILE[+0xOFF] frames name FILE itself; the offset counts from the
    start of its executable mapping (file offset = OFF + that mapping's
    page offset). The text is what the kernel prints; the offsets come from
    nm and the program headers."""
    image = ElfImage.open(str(prog))
    (_v, seg_off, _size), = image.executable_segments()
    pgoff = seg_off & ~0xFFF
    lines = ["           chain-1  [000] .....  1.000000: <user stack trace>"]
    for name in CHAIN:
        sym = image.find(name)[0]
        off = image.file_offset(sym.address + 3) - pgoff
        lines.append(f" => {prog}[+0x{off:x}]")
    (tmp_path / "trace").write_text("\n".join(lines) + "\n")
    res = run_ustack("symbolize", tmp_path / "trace", "--binary", prog)
    assert res.returncode == 0 and res.stderr == ""
    stack, = user_stacks(res.stdout)
    # offsets as put in: the leaf exact, the return addresses looked up at -1
    assert [label.split("/", 1)[0] for label in stack] == [f"{n}+0x3" for n in CHAIN]


def test_symbolize_repeated_frames(prog, tmp_path):
    """A trace repeats its frames: each is named as its place in its stack
    says, every time. A function's first byte is that function as the leaf
    (where the thread was), and the function before it as a return address
    (looked up at -1)."""
    image = ElfImage.open(str(prog))
    (_v, seg_off, _size), = image.executable_segments()
    pgoff = seg_off & ~0xFFF
    c, d = image.find("c")[0], image.find("d")[0]

    def frame(address):
        return f" => {prog}[+0x{image.file_offset(address) - pgoff:x}]"

    head = "           chain-1  [000] .....  1.000000: <user stack trace>"
    first = [head, frame(d.address + 3), frame(c.address)]
    second = [head, frame(c.address), frame(d.address + 3)]
    (tmp_path / "trace").write_text("\n".join(first + second + first + second) + "\n")
    res = run_ustack("symbolize", tmp_path / "trace", "--binary", prog)
    assert res.returncode == 0 and res.stderr == ""
    stacks = user_stacks(res.stdout)
    assert len(stacks) == 4 and stacks[2:] == stacks[:2]
    as_leaf, as_caller = stacks[1][0], stacks[0][1]
    assert as_leaf.startswith("c+0x0/")
    before = image.lookup(c.address - 1)
    assert not as_caller.startswith("c+")
    assert as_caller.startswith(f"{before.name}+" if before else "[unknown]")
    assert stacks[0][0].startswith("d+0x3/") and stacks[1][1].startswith("d+0x3/")


GARBAGE = (b"\x00\xff\xfe garbage \xc3(\n"
           b"           chain-1  [000] .....  1.000000: <user stack trace>\n"
           b" => <zzzz>\n"
           b" =>  <0000000000001234>\n"
           b" => /no/such/file[+0x10]\n"
           b" => [+0x10]\n"
           b"           chain-1  [000] .....  1.000000: <stack trace>\n"
           b" => __x64_sys_write+0x19/0x30\n"
           b" =>  <ffffffff81000000>\n"
           b"no newline at the end \x80")


def test_garbage_passes_through(prog, tmp_path):
    (tmp_path / "trace").write_bytes(GARBAGE)
    res = run_ustack("symbolize", tmp_path / "trace", "--binary", prog, text=False)
    assert res.returncode == 0, res.stderr
    assert b"Traceback" not in res.stderr
    out = res.stdout.split(b"\n")
    src = GARBAGE.split(b"\n")
    assert out[0] == src[0] and out[1] == src[1] and out[2] == src[2]
    assert out[3] == b" =>  <0000000000001234> : [unknown]"
    assert out[4] == b" => /no/such/file[+0x10] : [unknown] [file]"
    assert out[5:] == src[5:]              # the kernel stack and the rest unchanged


@pytest.mark.parametrize("content, why", [
    ("hello world\n", "line 1 is not a /proc/PID/maps line: 'hello world'"),
    ("", None),
    ("00400000-00401000 r--p 00000000 fe:00 12 /bin/x\n", None),
])
def test_bad_maps_file(prog, tmp_path, content, why):
    (tmp_path / "trace").write_text(" =>  <0000000000001234>\n")
    (tmp_path / "maps").write_text(content)
    res = run_ustack("symbolize", tmp_path / "trace", "--maps", tmp_path / "maps")
    assert res.returncode == 1 and res.stdout == ""
    maps = tmp_path / "maps"
    want = (f"ustack: {maps}: not a /proc/PID/maps file: {why}\n" if why
            else f"ustack: {maps}: no executable mappings in it\n")
    assert res.stderr == want


def test_bad_arguments(prog, tmp_path):
    trace = tmp_path / "trace"
    trace.write_text("")
    cases = [
        (["symbolize", tmp_path / "none", "--binary", prog],
         f"ustack: {tmp_path / 'none'}: No such file or directory\n"),
        (["symbolize", trace, "--binary", tmp_path / "none"],
         f"ustack: no such binary: {tmp_path / 'none'}\n"),
        (["symbolize", trace, "--binary", trace], f"ustack: {trace}: not an ELF file\n"),
        (["symbolize", trace, "--maps", tmp_path], f"ustack: {tmp_path}: Is a directory\n"),
    ]
    truncated = tmp_path / "truncated"
    truncated.write_bytes(prog.read_bytes()[:200])
    for args, want in cases:
        res = run_ustack(*args)
        assert (res.returncode, res.stderr) == (1, want)
    res = run_ustack("symbolize", trace, "--binary", truncated)
    assert res.returncode == 1 and res.stderr.startswith(f"ustack: {truncated}: corrupt ELF")
    assert res.stderr.count("\n") == 1
    res = run_ustack("symbolize", trace)
    assert res.returncode == 1 and res.stderr.startswith("ustack: one of the arguments")
    dead = subprocess.Popen(["true"])
    dead.wait()
    res = run_ustack("symbolize", trace, "--pid", dead.pid)
    assert (res.returncode, res.stderr) == (1, (
        f"ustack: no such process: {dead.pid} (a saved copy of its /proc/PID/maps "
        "can be given with --maps)\n"))
