"""Every file ustack writes as root goes through output.py: names planted
by another user (links at the final or temporary names, a device, a
pre-made archive directory, a crafted recording) make it refuse or write
only what was asked; a full filesystem or a damaged cache entry is one
line of error or a rebuilt entry, never a traceback."""
from __future__ import annotations

import contextlib
import gzip
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from helpers import FP, build, run_ustack, ustack_env

from ustack.recording import format as rf
from ustack.model import CommEvent, Losses, Mapping, MmapEvent, Piece, RawSample
from ustack.objfile import debuginfo
from ustack.objfile.elf import ElfImage
from ustack.report.output import open_output
from ustack.recording.writer import Recorder, RecordWriter
from ustack.target.mappings import MappingTracker

FIXTURES = Path(__file__).resolve().parent / "fixtures"
VICTIM = b"root's file, not to be touched\n"


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_bytes(VICTIM)
    return path


def one_line_error(res, text: str, after_run: bool = False) -> None:
    """One line of error (after the run's own "Tracing…" line, when it
    ran), naming what went wrong."""
    assert res.returncode != 0
    lines = res.stderr.splitlines()
    assert "Traceback" not in res.stderr and len(lines) == 1 + after_run, res.stderr
    assert lines[-1].startswith("ustack: ") and text in lines[-1], res.stderr


def null_device(directory: Path) -> Path:
    """A character device like /dev/null (our own node, not the machine's)."""
    dev = directory / "null"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    return dev


# -- a link at the name ------------------------------------------------------------

@pytest.mark.kernel
@pytest.mark.parametrize("how", [("count", "-o"), ("record", "-o"), ("count", "--record")])
def test_a_link_at_the_name_is_refused(chain, tmp_path, victim, how):
    command, option = how
    link = tmp_path / "out.txt"
    link.symlink_to(victim)
    res = run_ustack(command, f"uprobe:{chain}:d", "-c", f"{chain} 2", option, link)
    one_line_error(res, f"{link} is a symbolic link; ustack does not write through links")
    assert res.stdout == ""                       # refused before the command ran
    assert link.is_symlink() and victim.read_bytes() == VICTIM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim"]


def test_links_at_the_old_temporary_name_are_not_followed(tmp_path, victim):
    """-o FILE was written at FILE.partial-PID, a name anyone could plant."""
    out = tmp_path / "stacks.txt"
    planted = tmp_path / f"stacks.txt.partial-{os.getpid()}"
    planted.symlink_to(victim)
    with open_output(str(out)) as f:
        f.write("the report\n")
    assert out.read_text() == "the report\n" and not out.is_symlink()
    assert victim.read_bytes() == VICTIM and planted.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([planted.name, "stacks.txt",
                                                                 "victim"])


def test_a_link_at_the_old_temporary_name_of_a_recording_is_not_followed(tmp_path, victim):
    """record -o FILE was written at FILE.partial-PID too."""
    out = tmp_path / "run.data"
    planted = tmp_path / f"run.data.partial-{os.getpid()}"
    planted.symlink_to(victim)
    recorder = Recorder(str(out), MappingTracker(live=False), None, ["e"], ["fp"],
                        "perf", {})
    recorder.close(Losses(), whole=True)
    assert victim.read_bytes() == VICTIM and planted.is_symlink()
    assert gzip.decompress(out.read_bytes()).startswith(rf.MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([planted.name, "run.data",
                                                                 "victim"])


# -- a device at the name ----------------------------------------------------------

@pytest.mark.kernel
@pytest.mark.parametrize("how", [("record", "-o"), ("count", "--record"), ("count", "-o")])
def test_a_device_is_written_in_place_never_replaced(chain, tmp_path, how):
    command, option = how
    dev = null_device(tmp_path)
    res = run_ustack(command, f"uprobe:{chain}:d", "-c", f"{chain} 2", option, dev)
    assert res.returncode == 0, res.stderr
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert os.lstat(dev).st_rdev == os.stat("/dev/null").st_rdev
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


@pytest.mark.kernel
@pytest.mark.parametrize("command", ["record", "count"])
def test_a_full_device_is_one_line_and_stays_a_device(chain, tmp_path, command):
    """-o /dev/full: the write error said, the node never replaced."""
    dev = tmp_path / "full"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.stat("/dev/full").st_rdev)
    res = run_ustack(command, f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", dev)
    one_line_error(res, f"{dev}: No space left on device", after_run=True)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    assert os.lstat(dev).st_rdev == os.stat("/dev/full").st_rdev
    assert [p.name for p in tmp_path.iterdir()] == ["full"]


@pytest.mark.kernel
def test_a_link_to_a_device_is_refused(chain, tmp_path):
    dev = null_device(tmp_path)
    link = tmp_path / "out.data"
    link.symlink_to(dev)
    res = run_ustack("record", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", link)
    one_line_error(res, "is a symbolic link")
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and link.is_symlink()


# -- archives ----------------------------------------------------------------------

@pytest.mark.kernel
def test_an_archive_directory_made_by_someone_else_is_refused(chain, tmp_path, victim):
    data = tmp_path / "run.data"
    planted = tmp_path / "run.data.objects"
    planted.mkdir()
    (planted / "chain").symlink_to(victim)
    (planted / "libc.so.6").symlink_to(victim)
    (planted / ".build-id").symlink_to(tmp_path)
    res = run_ustack("record", "--archive", "-o", data, f"uprobe:{chain}:d",
                     "-c", f"{chain} 2")
    one_line_error(res, f"{planted} exists already: remove it or name another directory")
    assert res.stdout == "" and not data.exists()       # refused before the run
    assert victim.read_bytes() == VICTIM
    assert sorted(p.name for p in planted.iterdir()) == [".build-id", "chain", "libc.so.6"]
    # and `ustack archive` of a recording refuses it the same way
    shutil.copy(FIXTURES / "count-d-fp.ustack", data)
    one_line_error(run_ustack("archive", data),
                   f"{planted} exists already: remove it or name another directory")
    assert victim.read_bytes() == VICTIM


def crafted_recording(path: Path, files: list) -> None:
    """A recording whose one process maps each of `files` (as executable
    code) and has a stack through all of them."""
    maps = [Mapping(0x1000_0000 * (i + 1), 0x1000_0000 * (i + 1) + 0x2000, 0, str(f))
            for i, f in enumerate(files)]
    chain = b"".join((m.start + 0x100).to_bytes(8, "little") for m in maps)
    with RecordWriter(str(path), ["e"], ["fp"], "perf") as writer:
        writer.add_piece(Piece([CommEvent(100, 100, "x", True)]
                               + [MmapEvent(100, 100, m) for m in maps],
                               [RawSample(0, 100, 100, 1, 0, callchain=chain)]))


def test_archive_copies_only_proven_objects_no_wider_than_they_were(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$secret\n")
    secret.chmod(0o600)
    private = tmp_path / "private-tool"                # an ELF object only root reads
    shutil.copy(FIXTURES / "chain-o2-nofp", private)
    private.chmod(0o700)
    plain = tmp_path / "no-build-id"               # as Go links by default
    shutil.copy(build("chain", flags=(*FP, "-Wl,--build-id=none")), plain)
    assert ElfImage.open(str(plain)).build_id is None
    plain.chmod(0o640)
    rec = tmp_path / "crafted.ustack"
    crafted_recording(rec, [secret, private, plain])
    into = tmp_path / "archived"
    res = run_ustack("archive", rec, "-o", into)
    assert res.returncode == 0, res.stderr
    assert (f"ustack: {secret} not archived: not an ELF object with code, as the "
            "recorded mapping was") in res.stderr
    assert sorted(p.name for p in into.iterdir()) == ["no-build-id", "private-tool"]
    for source, mode in ((private, 0o700), (plain, 0o640)):
        copy = into / source.name
        assert copy.read_bytes() == source.read_bytes()
        assert stat.S_IMODE(copy.stat().st_mode) == mode
    assert stat.S_IMODE(into.stat().st_mode) & 0o022 == 0


def test_archive_refuses_a_file_that_is_not_the_recorded_one(tmp_path):
    """A build-id recorded (or forged) that the file does not have: not copied."""
    binary = tmp_path / "tool"
    shutil.copy(FIXTURES / "chain-o2-nofp", binary)
    rec = tmp_path / "run.ustack"
    mapping = Mapping(0x1000_0000, 0x1000_2000, 0, str(binary), "", "ab" * 20)
    with RecordWriter(str(rec), ["e"], ["fp"], "perf") as writer:
        writer.add_piece(Piece([CommEvent(100, 100, "x", True), MmapEvent(100, 100, mapping)],
                               [RawSample(0, 100, 100, 1, 0,
                                          callchain=(0x1000_0100).to_bytes(8, "little"))]))
    res = run_ustack("archive", rec, "-o", tmp_path / "archived")
    assert res.returncode == 0, res.stderr
    assert list((tmp_path / "archived").iterdir()) == []


# -- a full filesystem -------------------------------------------------------------

@pytest.fixture
def full_fs(tmp_path):
    """A small tmpfs of our own, filled up."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.kernel
@pytest.mark.parametrize("how", [("record", "-o"), ("count", "--record"), ("count", "-o"),
                                 ("trace", "-o")])
def test_a_full_filesystem_is_one_line_and_leaves_nothing(chain, full_fs, how):
    command, option = how
    out = full_fs / "out.txt"
    res = run_ustack(command, f"uprobe:{chain}:d", "-c", f"{chain} 2", option, out)
    one_line_error(res, f"{out}: No space left on device", after_run=True)
    assert [p.name for p in full_fs.iterdir()] == ["filler"]


def test_a_full_filesystem_in_report(full_fs):
    out = full_fs / "out.folded"
    res = run_ustack("report", FIXTURES / "count-d-fp.ustack", "--objects", FIXTURES,
                     "-o", out)
    one_line_error(res, f"-o {out}: No space left on device")
    assert [p.name for p in full_fs.iterdir()] == ["filler"]


# -- damaged cache entries ---------------------------------------------------------

def report_with_cache(cache: Path) -> subprocess.CompletedProcess:
    """A report that reads (and fills) images, symbols, CFI, line caches."""
    env = dict(ustack_env(), USTACK_CACHE_DIR=str(cache))
    res = run_ustack("report", FIXTURES / "count-write-dwarf.ustack", "--objects", FIXTURES,
                     "-f", "folded", "--lines", "--inlines", env=env)
    assert res.returncode == 0, res.stderr
    return res


def test_a_damaged_cache_entry_is_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = report_with_cache(cache)
    entries = sorted(p for p in cache.rglob("*") if p.is_file())
    kinds = {p.parent.name for p in entries}
    assert {"images", "symbols", "cfi"} <= kinds, kinds
    good = {p: p.read_bytes() for p in entries}
    for p in entries:     # the last byte: in the image cache, its packed names
        p.write_bytes(good[p][:-1] + (b"\x80" if good[p][-1:] != b"\x80" else b"\x81"))
    again = report_with_cache(cache)
    assert (again.stdout, again.stderr) == (first.stdout, first.stderr)
    rewritten = {p for p in entries if p.read_bytes() == good[p]}
    assert {p.parent.name for p in rewritten} >= {"images", "cfi"}, rewritten
    assert all(p.read_bytes() == good[p] for p in entries if p.parent.name == "images")


@pytest.mark.parametrize("kind", ["images", "symbols", "cfi", "lines"])
def test_each_damaged_cache_kind_is_rebuilt(tmp_path, kind):
    """One byte flipped anywhere in one entry of a kind: the same answers.
    (The symbols are read when an image is parsed: its entry removed.)"""
    cache = tmp_path / "cache"
    first = report_with_cache(cache)
    for p in sorted((cache / kind).iterdir()):
        if kind == "symbols":
            shutil.rmtree(cache / "images")
        good = p.read_bytes()
        data = bytearray(good)
        data[len(data) // 2] ^= 0x80
        p.write_bytes(bytes(data))
        again = report_with_cache(cache)
        assert (again.stdout, again.stderr) == (first.stdout, first.stderr), p
        assert p.read_bytes() == good, p                     # rewritten whole


def test_a_damaged_minidebuginfo_copy_is_rebuilt(tmp_path, monkeypatch):
    """The ELF inside .gnu_debugdata, kept decompressed in the cache: damaged,
    it is decompressed again, never believed."""
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    prog = build("chain", flags=FP)
    mini = tmp_path / "mini"
    shutil.copy(prog, mini)
    subprocess.run(["objcopy", "--only-keep-debug", str(prog), str(tmp_path / "dbg")],
                   check=True)
    subprocess.run(["xz", "-kf", str(tmp_path / "dbg")], check=True)
    subprocess.run(["objcopy", "--add-section", f".gnu_debugdata={tmp_path}/dbg.xz",
                    str(mini)], check=True)
    image = ElfImage.open(str(mini))
    found = debuginfo.DebugLookup()
    path = debuginfo.minidebuginfo_path(image, found)
    assert path is not None, found.refused
    good = Path(path).read_bytes()
    Path(path).write_bytes(good[:100] + bytes([good[100] ^ 0x80]) + good[101:])
    ElfImage.clear_cache()
    assert debuginfo.minidebuginfo_path(ElfImage.open(str(mini)), found) == path
    assert Path(path).read_bytes() == good
