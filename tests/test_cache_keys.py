"""What the cache keeps of an object is found by the bytes it was built
from, never by names the object's builder chose (build-id, table sizes):
a copy of a program with the same build-id but other symbol names or
other unwind rules, opened first (`list`, a trace of the copy), changes
nothing of what later runs say about the original."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import (O2_NOFP, build, funcs, ok, parse_counts, parse_trace, run_ustack,
                     ustack_env)

# the original's functions -> the copy's, names of the same lengths: the
# build-id and every section's size stay the same
RENAMED = {b"a": b"w", b"b": b"x", b"c": b"y", b"d": b"z", b"main": b"PWND"}


def section(path, name: str) -> tuple[int, int]:
    """(file offset, size) of the section `name`."""
    out = subprocess.run(["readelf", "-SW", str(path)], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        fields = line.replace("[ ", "[").split()
        if len(fields) > 5 and fields[1] == name:
            return int(fields[4], 16), int(fields[5], 16)
    raise AssertionError(f"no {name} in {path}")


def build_id(path) -> str:
    out = subprocess.run(["readelf", "-nW", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return out.split("Build ID:")[1].split()[0]


def copy_with_section(original, copy, name: str, rewrite) -> None:
    """`copy`: `original` with section `name`'s bytes rewritten (same length)."""
    data = bytearray(original.read_bytes())
    offset, size = section(original, name)
    new = rewrite(bytes(data[offset:offset + size]))
    assert len(new) == size and new != data[offset:offset + size]
    data[offset:offset + size] = new
    copy.write_bytes(bytes(data))
    copy.chmod(0o755)
    assert build_id(copy) == build_id(original)


def renamed(path):
    """A rewrite of `path`'s .strtab that gives its functions RENAMED's
    names (one byte may name several symbols: a name that ends another
    shares its bytes, and both change)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        at = {s.name.encode(): s["st_name"] for s in symtab.iter_symbols()
              if s.name.encode() in RENAMED}
    assert set(at) == set(RENAMED)

    def rewrite(strtab: bytes) -> bytes:
        out = bytearray(strtab)
        for old, offset in at.items():
            out[offset:offset + len(old)] = RENAMED[old]
        return bytes(out)
    return rewrite


@pytest.fixture
def shared_cache(tmp_path):
    """The environment of root's runs, all with one cache directory."""
    return dict(ustack_env(), USTACK_CACHE_DIR=str(tmp_path / "cache"))


def listing(path, env) -> set:
    """The function names `ustack list PATH` prints."""
    res = run_ustack("list", path, env=env)
    assert res.returncode == 0, res.stderr
    return {line.split()[3] for line in res.stdout.splitlines()[1:] if line.strip()}


def test_a_renamed_copy_listed_first_leaves_the_originals_names(tmp_path, shared_cache):
    original = tmp_path / "chain"
    shutil.copy(build("chain", flags=O2_NOFP), original)
    copy = tmp_path / "chain-copy"
    copy_with_section(original, copy, ".strtab", renamed(original))
    listed = listing(copy, shared_cache)
    assert {"w", "x", "y", "z", "PWND"} <= listed, listed
    names = listing(original, shared_cache)
    assert {"a", "b", "c", "d", "main"} <= names, names
    assert not names & {"w", "x", "y", "z", "PWND"}, names


@pytest.mark.kernel
def test_a_renamed_copy_traced_first_leaves_the_originals_names_and_probes(
        tmp_path, shared_cache):
    original = tmp_path / "chain"
    shutil.copy(build("chain", flags=O2_NOFP), original)
    copy = tmp_path / "chain-copy"
    copy_with_section(original, copy, ".strtab", renamed(original))
    res = ok(run_ustack("trace", f"uprobe:{copy}:z", "-c", f"{copy} 1", env=shared_cache))
    assert funcs(parse_trace(res.stdout)[0]["frames"])[:5] == ["z", "y", "x", "w", "PWND"]
    res = ok(run_ustack("trace", f"uprobe:{original}:d", "-c", f"{original} 1",
                        env=shared_cache))
    events = parse_trace(res.stdout)
    assert len(events) == 1, res.stdout
    assert funcs(events[0]["frames"])[:5] == ["d", "c", "b", "a", "main"], res.stdout


def no_unwind_rules(eh_frame: bytes) -> bytes:
    """An .eh_frame that ends at once (a zero length): no FDE at all."""
    return bytes(len(eh_frame))


@pytest.mark.kernel
@pytest.mark.parametrize("unwind", ["dwarf", "auto"])
def test_a_copy_without_unwind_rules_traced_first_leaves_the_originals_stacks(
        tmp_path, shared_cache, unwind):
    original = tmp_path / "chain"
    shutil.copy(build("chain", flags=O2_NOFP), original)
    copy = tmp_path / "chain-copy"
    copy_with_section(original, copy, ".eh_frame", no_unwind_rules)
    res = ok(run_ustack("trace", f"uprobe:{copy}:d", "-c", f"{copy} 1", "--unwind", unwind,
                        env=shared_cache))
    assert funcs(parse_trace(res.stdout)[0]["frames"])[:5] != ["d", "c", "b", "a", "main"]
    res = ok(run_ustack("trace", f"uprobe:{original}:d", "-c", f"{original} 1",
                        "--unwind", unwind, env=shared_cache))
    events = parse_trace(res.stdout)
    assert len(events) == 1, res.stdout
    assert funcs(events[0]["frames"])[:5] == ["d", "c", "b", "a", "main"], res.stdout


def counted_stacks(program, env) -> list:
    """The stacks `ustack count --backend bpf --unwind dwarf` counts at d
    (unwound inside the kernel with the rows of the cache)."""
    res = ok(run_ustack("count", "--backend", "bpf", "--unwind", "dwarf",
                        f"uprobe:{program}:d", "-c", f"{program} 1", env=env))
    return [funcs(stack["frames"])[:5] for stack in parse_counts(res.stdout)]


@pytest.mark.kernel
def test_a_copy_without_unwind_rules_counted_first_leaves_the_originals_kernel_rows(
        tmp_path, shared_cache):
    original = tmp_path / "chain"
    shutil.copy(build("chain", flags=O2_NOFP), original)
    copy = tmp_path / "chain-copy"
    copy_with_section(original, copy, ".eh_frame", no_unwind_rules)
    assert counted_stacks(copy, shared_cache) != [["d", "c", "b", "a", "main"]]
    assert counted_stacks(original, shared_cache) == [["d", "c", "b", "a", "main"]]
