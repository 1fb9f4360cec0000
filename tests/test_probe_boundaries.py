"""A uprobe goes only on an instruction start that decoding from a start the
file states (symbol, FDE, Go table) proves: in a fully stripped binary,
at an address only a debug file names, and whatever the image cache says.
The target's printed checksum is the judge: a probe inside an instruction
changes it or kills the program."""
from __future__ import annotations

import json
import re
import subprocess
from types import SimpleNamespace

import pytest

from helpers import build, events_lost, run_ustack

from ustack.model import UstackError
from ustack.objfile import cache as image_cache
from ustack.objfile.elf import ElfImage
from ustack.probes.resolve import resolve_uprobes
from ustack.probes.spec import parse_event

BACKENDS = ("perf", "bpf", "tracefs")
UNPROVEN = ("no function start is known at or before 0x{a:x} (no symbol, CFI or Go "
            "table of the file covers it), so ustack cannot prove it is an "
            "instruction boundary; add --unsafe-address to probe it anyway")


def sh(*cmd) -> str:
    return subprocess.run([str(c) for c in cmd], check=True, capture_output=True,
                          text=True).stdout


def instruction_starts(path, lo: int, hi: int) -> list:
    """objdump's instruction addresses in [lo, hi)."""
    out = sh("objdump", "-d", "--no-show-raw-insn", f"--start-address=0x{lo:x}",
             f"--stop-address=0x{hi:x}", path)
    return [int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):", out, re.M)]


def symbol(path, name: str) -> tuple:
    """(address, size) of function `name` in path's symbol table."""
    for line in sh("readelf", "-sW", path).splitlines():
        f = line.split()
        if len(f) == 8 and f[3] == "FUNC" and f[7] == name:
            return int(f[1], 16), int(f[2], 0)
    pytest.skip(f"{path} has no function {name}")


def resolve(text: str, **kw):
    return resolve_uprobes(parse_event(text), **kw)


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    """checksum at -O2, its `strip -s` copy (which keeps .eh_frame), the
    range of mix() and its instruction starts, and the output to expect."""
    full = build("checksum", flags=("-O2",))
    d = tmp_path_factory.mktemp("checksum")
    stripped = d / "checksum"
    sh("strip", "-s", "-o", stripped, full)
    assert ".eh_frame" in sh("readelf", "-SW", stripped)
    assert ".symtab" not in sh("readelf", "-SW", stripped)
    lo, size = symbol(full, "mix")
    return SimpleNamespace(full=full, stripped=stripped, lo=lo, hi=lo + size, dir=d,
                           starts=instruction_starts(full, lo, lo + size),
                           output=sh(full))


def judge(res, prog) -> None:
    """The run worked and the target printed what it prints unprobed."""
    assert res.returncode == 0, res.stderr
    assert prog.output in res.stdout, (res.stdout, res.stderr)


# --- every byte of a function in a fully stripped binary -------------------------

@pytest.fixture(scope="module")
def verdicts(prog):
    """The resolver's answer for every byte offset of mix in the stripped
    copy: (accepted addresses, {refused address: its error}). The answer
    is the same for every backend: they all place what the resolver gives."""
    accepted, refused = [], {}
    for a in range(prog.lo, prog.hi):
        try:
            probe, = resolve(f"uprobe:{prog.stripped}:0x{a:x}")
        except UstackError as e:
            refused[a] = str(e)
        else:
            accepted.append(a)
            assert probe.file_offset == _file_offset(prog, a)
    return accepted, refused


def test_every_offset_of_a_stripped_function(prog, verdicts, capsys):
    """Exactly the instruction starts are accepted; each other offset is
    refused with one line that says where the instruction is."""
    accepted, refused = verdicts
    assert accepted == prog.starts
    assert len(refused) == prog.hi - prog.lo - len(prog.starts) > 0
    for a, error in refused.items():
        inside = max(s for s in prog.starts if s <= a)
        assert re.fullmatch(
            rf"0x{a:x} in {re.escape(str(prog.stripped))} is not on an instruction "
            rf"boundary \(inside '[^'\n]+' at 0x{inside:x}, decoding from the CFI "
            rf"start 0x{prog.lo:x}\)", error), error
    with capsys.disabled():
        print(f"\nmix: {prog.hi - prog.lo} offsets, {len(accepted)} accepted "
              f"(instruction starts), {len(refused)} refused")


def _insn(e) -> str:
    return re.search(r"inside '([^']*)'", str(e)).group(1)


def _file_offset(prog, vaddr: int) -> int:
    """vaddr's file offset from readelf's program headers."""
    for line in sh("readelf", "-lW", prog.full).splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            off, va, filesz = int(f[1], 16), int(f[2], 16), int(f[4], 16)
            if va <= vaddr < va + filesz:
                return vaddr - va + off
    raise AssertionError(f"0x{vaddr:x} is in no segment")


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_accepted_offsets_change_nothing(prog, verdicts, backend):
    """A probe on every offset of mix the resolver accepts, all at once:
    the checksum is the one printed unprobed, and the probes were hit
    (counted with the hits a full buffer lost: the perf backend loses some
    when the machine is busy)."""
    accepted, _refused = verdicts
    events = [f"uprobe:{prog.stripped}:0x{a:x}" for a in accepted]
    res = run_ustack("count", *events, "-c", prog.stripped, "--backend", backend,
                     timeout=180)
    judge(res, prog)
    hits = [int(n) for n in re.findall(r"^\s+(\d+)$", res.stdout, re.M)]
    assert sum(hits) + events_lost(res.stderr) >= 1000 * len(accepted) // 2, (
        res.stdout, res.stderr)


@pytest.mark.kernel
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_refusal_through_the_command(prog, backend):
    """One line, exit status 1, and the command never ran."""
    a = next(a for a in range(prog.lo, prog.hi) if a not in prog.starts)
    inside = max(s for s in prog.starts if s <= a)
    res = run_ustack("count", f"uprobe:{prog.stripped}:0x{a:x}", "-c",
                     prog.stripped, "--backend", backend)
    assert res.returncode == 1 and res.stdout == ""
    assert re.fullmatch(
        rf"ustack: 0x{a:x} in {re.escape(str(prog.stripped))} is not on an instruction "
        rf"boundary \(inside '[^'\n]+' at 0x{inside:x}, decoding from the CFI start "
        rf"0x{prog.lo:x}\)\n", res.stderr), res.stderr


def test_a_uretprobe_only_on_a_function_start(prog):
    """In a stripped binary too: elsewhere [sp] holds no return address for
    the kernel to replace."""
    probe, = resolve(f"uretprobe:{prog.stripped}:0x{prog.lo:x}")
    assert probe.file_offset == _file_offset(prog, prog.lo)
    a = prog.starts[1]
    with pytest.raises(UstackError) as e:
        resolve(f"uretprobe:{prog.stripped}:0x{a:x}")
    assert str(e.value) == (f"a uretprobe must be on a function's entry, and 0x{a:x} "
                            f"in {prog.stripped} is inside the function at 0x{prog.lo:x}")


# --- no start known: refused unless --unsafe-address -----------------------------

@pytest.fixture(scope="module")
def no_cfi(prog):
    """The stripped checksum without .eh_frame: nothing states where mix starts."""
    path = prog.dir / "no-cfi"
    sh("strip", "-s", "-R", ".eh_frame", "-R", ".eh_frame_hdr", "-o", path, prog.full)
    return path


def test_no_known_start_is_refused_unless_unsafe(prog, no_cfi):
    a = prog.starts[3]
    with pytest.raises(UstackError) as e:
        resolve(f"uprobe:{no_cfi}:0x{a:x}")
    assert str(e.value) == f"uprobe:{no_cfi}:0x{a:x}: " + UNPROVEN.format(a=a)
    probe, = resolve(f"uprobe:{no_cfi}:0x{a:x}", unsafe=True)
    assert probe.file_offset == _file_offset(prog, a)
    # where a walk does prove the address inside an instruction, the flag
    # does not override it
    with pytest.raises(UstackError, match="not on an instruction boundary"):
        resolve(f"uprobe:{prog.stripped}:0x{a + 1:x}", unsafe=True)


@pytest.mark.kernel
def test_unsafe_address_through_the_command(prog, no_cfi):
    a = prog.starts[3]
    res = run_ustack("count", f"uprobe:{no_cfi}:0x{a:x}", "-c", no_cfi)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr == f"ustack: uprobe:{no_cfi}:0x{a:x}: {UNPROVEN.format(a=a)}\n"
    res = run_ustack("count", f"uprobe:{no_cfi}:0x{a:x}", "-c", no_cfi,
                     "--unsafe-address")
    judge(res, prog)


# --- starts that lie: a crafted symbol, an edited cache ----------------------------

def test_a_crafted_symbol_inside_an_instruction(prog):
    """A .symtab entry in the middle of mix's first instruction: the walk
    from the FDE's start contradicts it."""
    text = int(next(line.split()[3] for line in sh("readelf", "-SW", prog.full).splitlines()
                    if " .text " in line), 16)
    crafted = prog.dir / "crafted"
    sh("objcopy", "--add-symbol", f"crafted=.text:0x{prog.lo + 1 - text:x},function,global",
       prog.full, crafted)
    with pytest.raises(UstackError) as e:
        resolve(f"uprobe:{crafted}:crafted")
    assert str(e.value) == (
        f"crafted in {crafted} is not on an instruction boundary (inside "
        f"'{_insn(e.value)}' at 0x{prog.lo:x}, decoding from the CFI start 0x{prog.lo:x})")


@pytest.mark.kernel
def test_an_edited_cache_entry(prog, tmp_path, monkeypatch):
    """The image cache says mix starts one byte later (inside its first
    instruction): refused, and the target untouched."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("USTACK_CACHE_DIR", str(cache))
    ElfImage.clear_cache()
    try:
        ElfImage.open(str(prog.full)).functions       # writes the cache entries
    finally:
        ElfImage.clear_cache()
    edited = 0
    # edited as a hostile user would: entries rewritten whole, checksums
    # made anew (through the cache's own reader and writer)
    for entry in (cache / "images").glob("*.json"):
        layout, symbols, lookup = image_cache.read(str(entry)).split(b"\n", 2)
        d = json.loads(symbols)
        for sym in d["named"]:
            if sym[0] == "mix":
                sym[1] += 1
                edited += 1
        image_cache.write(str(entry), b"\n".join([layout, json.dumps(d).encode(), lookup]))
    for entry in (cache / "symbols").glob("*.json"):
        d = json.loads(image_cache.read(str(entry)))
        for sym in d["functions"]:
            if sym[1] == "mix":
                sym[0] += 1
                edited += 1
        image_cache.write(str(entry), json.dumps(d).encode())
    assert edited == 2
    res = run_ustack("count", f"uprobe:{prog.full}:mix", "-c", prog.full)
    assert res.returncode == 1 and res.stdout == "", res.stdout
    assert re.fullmatch(rf"ustack: mix in {re.escape(str(prog.full))} is not on an "
                        rf"instruction boundary \(inside '[^'\n]+' at mix\+0x0\)\n",
                        res.stderr), res.stderr


# --- an address only the debug file names ----------------------------------------

@pytest.fixture(scope="module")
def libc_function():
    """(libc's path, new_do_write's start, its instruction starts), the
    function found in libc's debug file: libc itself only exports names."""
    libc = next((line.split(" => ")[1].strip() for line in sh("ldconfig", "-p").splitlines()
                 if line.strip().startswith("libc.so.6 ") and "x86-64" in line), None)
    if libc is None:
        pytest.skip("ldconfig does not know libc.so.6")
    bid = re.search(r"Build ID: ([0-9a-f]+)", sh("readelf", "-n", libc))
    debug = f"/usr/lib/debug/.build-id/{bid.group(1)[:2]}/{bid.group(1)[2:]}.debug" \
        if bid else None
    try:
        start, size = symbol(debug, "new_do_write")
    # (a stripped libc: the function is local, only the debug file names it)
    except (subprocess.CalledProcessError, TypeError):
        pytest.skip("libc's debug file (libc6-dbg) is not installed")
    assert "new_do_write" not in sh("readelf", "-sW", "--dyn-syms", libc)
    import os
    return os.path.realpath(libc), start, instruction_starts(libc, start, start + size)


def test_debug_file_names_are_decoded_from_their_start(libc_function):
    libc, start, starts = libc_function
    mid = starts[2] + 2                 # inside its third instruction (a lea)
    with pytest.raises(UstackError) as e:
        resolve(f"uprobe:libc:0x{mid:x}")
    assert str(e.value) == (
        f"new_do_write+0x{mid - start:x} in {libc} is not on an instruction boundary "
        f"(inside '{_insn(e.value)}' at new_do_write+0x{starts[2] - start:x})")
    at = starts[3]
    probe, = resolve(f"uprobe:libc:0x{at:x}")
    assert probe.label == f"uprobe:{libc}:new_do_write+0x{at - start:x}"
    # the return address's place counts from the debug file's symbol, by
    # address or by name: after `push r15` it is one word above sp
    assert probe.return_address_slot == 1
    probe, = resolve("uprobe:libc:new_do_write")
    assert (probe.address, probe.return_address_slot) == (start, 0)


@pytest.mark.kernel
def test_a_debug_file_address_through_the_command(prog, libc_function):
    """new_do_write writes the checksum line out of stdio's buffer."""
    libc, start, starts = libc_function
    at = starts[3]
    res = run_ustack("count", f"uprobe:libc:0x{at:x}", "-c", prog.stripped)
    judge(res, prog)
    assert re.search(r"^\s+new_do_write \[libc\.so\.6\]$", res.stdout, re.M), res.stdout
    mid = starts[2] + 2
    res = run_ustack("count", f"uprobe:libc:0x{mid:x}", "-c", prog.stripped)
    assert res.returncode == 1 and res.stdout == "" and "instruction boundary" in res.stderr
