"""Names planted by another user where root's ustack will write: in a
sticky world-writable directory (as /tmp), an unprivileged user (nobody,
through setpriv) puts a FIFO, a hard link to their own file, a link to a
root's directory in place of a parent directory, or a device of theirs at
the name of every -o, recording and archive. Each is refused before
anything runs, in one line, at once (a FIFO never waited on), and nothing
of anyone is written; a FIFO or device of root's own, and the standard
streams by their names, are still written."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import FP, build, run_ustack, ustack_env

pytestmark = pytest.mark.kernel

FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDING = FIXTURES / "count-d-fp.ustack"
THEIRS = b"nobody's file\n"
ROOTS = b"root's file, not to be touched\n"
REFUSED_WITHIN_S = 5        # the bound is 1 s; the margin is for a loaded machine


@pytest.fixture(scope="module")
def chain():
    return build("chain", flags=FP)


def as_nobody(*argv) -> None:
    """Run argv as nobody: no groups, no capabilities."""
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    *map(str, argv)], check=True, capture_output=True)


@pytest.fixture
def shared():
    """A sticky world-writable directory of our own, as /tmp is."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed (needed to plant names as nobody)")
    directory = Path(tempfile.mkdtemp(prefix="ustack-shared-", dir="/tmp"))
    directory.chmod(0o1777)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def roots_dir():
    """A directory only root may enter, holding a file of root's."""
    directory = Path(tempfile.mkdtemp(prefix="ustack-root-", dir="/tmp"))
    (directory / "out").write_bytes(ROOTS)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


class Planted:
    """What nobody planted: `path` to give ustack, and `untouched()`, which
    says whether everything is as nobody left it."""

    def __init__(self, path: Path, untouched):
        self.path = path
        self.untouched = untouched


def plant(how: str, shared: Path, roots_dir: Path) -> Planted:
    out = shared / "out"
    if how == "fifo":
        as_nobody("mkfifo", "-m", "666", out)
        return Planted(out, lambda: (stat.S_ISFIFO(os.lstat(out).st_mode)
                                     and sorted(os.listdir(shared)) == ["out"]))
    if how == "hard link":
        theirs = shared / "theirs"
        as_nobody("sh", "-c", f"printf \"nobody's file\\n\" > {theirs} && ln {theirs} {out}")
        inode = os.lstat(theirs).st_ino
        return Planted(out, lambda: (theirs.read_bytes() == THEIRS
                                     and os.lstat(out).st_ino == inode
                                     and sorted(os.listdir(shared)) == ["out", "theirs"]))
    if how == "parent link":
        as_nobody("ln", "-s", roots_dir, shared / "lnk")
        return Planted(shared / "lnk" / "out", lambda: (
            (roots_dir / "out").read_bytes() == ROOTS
            and sorted(os.listdir(roots_dir)) == ["out"]
            and sorted(os.listdir(shared)) == ["lnk"]))
    assert how == "device"           # made by root, given to nobody: theirs
    os.mknod(out, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    os.chown(out, 65534, 65534)
    return Planted(out, lambda: (stat.S_ISCHR(os.lstat(out).st_mode)
                                 and sorted(os.listdir(shared)) == ["out"]))


def writers(chain) -> dict:
    """Every command that writes a file, as argv given the file's name."""
    run = ["-c", f"{chain} 2"]
    return {
        "count -o": lambda p: ["count", f"uprobe:{chain}:d", *run, "-o", p],
        "trace -o": lambda p: ["trace", f"uprobe:{chain}:d", *run, "-o", p],
        "profile -o": lambda p: ["profile", "-F", "99", *run, "-o", p],
        "record -o": lambda p: ["record", f"uprobe:{chain}:d", *run, "-o", p],
        "count --record": lambda p: ["count", f"uprobe:{chain}:d", *run, "--record", p],
        "offcpu -o": lambda p: ["offcpu", *run, "-o", p],
        "latency -o": lambda p: ["latency", f"uprobe:{chain}:d", *run, "-o", p],
        "memleak -o": lambda p: ["memleak", *run, "-o", p],
        "report -o": lambda p: ["report", RECORDING, "--objects", FIXTURES, "-o", p],
        "archive -o": lambda p: ["archive", RECORDING, "-o", p],
    }


COMMANDS = ["count -o", "trace -o", "profile -o", "record -o", "count --record",
            "offcpu -o", "latency -o", "memleak -o", "report -o", "archive -o"]


@pytest.mark.parametrize("how", ["fifo", "hard link", "parent link", "device"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_planted_name_is_refused_at_once_in_one_line(chain, shared, roots_dir,
                                                        command, how):
    planted = plant(how, shared, roots_dir)
    path = planted.path
    if command == "archive -o" and how == "parent link":
        path = path.with_name("archived")      # an archive goes into a new directory
    argv = writers(chain)[command](path)
    started = time.monotonic()
    try:
        res = run_ustack(*argv, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ustack {command} hung on a planted {how}")
    took = time.monotonic() - started
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ustack: "), res.stderr
    assert res.stdout == ""                      # refused before anything ran
    assert planted.untouched(), sorted(os.listdir(shared))
    assert took < REFUSED_WITHIN_S, f"refused after {took:.1f} s"


def test_a_planted_fifo_names_its_owner(chain, shared, roots_dir):
    planted = plant("fifo", shared, roots_dir)
    res = run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", planted.path,
                     timeout=30)
    assert res.stderr == (f"ustack: -o {planted.path} is a FIFO of another user "
                          "(uid 65534); ustack does not write to it\n")


def test_a_link_in_place_of_a_parent_directory_is_not_followed(chain, shared, roots_dir):
    planted = plant("parent link", shared, roots_dir)
    res = run_ustack("record", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", planted.path)
    assert res.stderr == (f"ustack: {planted.path}: {shared}/lnk is a symbolic link of "
                          "another user (uid 65534) in a sticky world-writable "
                          "directory; ustack does not follow it\n")


def test_a_link_of_roots_on_the_way_is_followed(chain, shared, roots_dir):
    """The rule is the kernel's protected_symlinks: the runner's own links
    (and the directory owner's) are followed."""
    (shared / "lnk").symlink_to(roots_dir)
    res = run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o",
                     shared / "lnk" / "new.folded")
    assert res.returncode == 0, res.stderr
    assert (roots_dir / "new.folded").read_text().endswith(";main;a;b;c;d 2\n")


def test_a_hard_link_to_roots_file_is_replaced_not_written(chain, shared):
    """nobody may link a file of root's they can write; trace -o replaces
    the name, the linked file keeps its bytes (it was truncated and
    overwritten)."""
    roots = shared / "roots"
    roots.write_bytes(ROOTS)
    roots.chmod(0o666)
    out = shared / "out"
    as_nobody("ln", roots, out)
    res = run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", out)
    assert res.returncode == 0, res.stderr
    assert roots.read_bytes() == ROOTS
    assert out.read_text().count(f": uprobe:{chain}:d\n") == 2
    assert sorted(os.listdir(shared)) == ["out", "roots"]


def test_roots_own_fifo_without_a_reader_is_refused_at_once(chain, shared):
    fifo = shared / "out"
    os.mkfifo(fifo, 0o600)
    started = time.monotonic()
    res = run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", fifo,
                     timeout=30)
    took = time.monotonic() - started
    assert res.stderr == (f"ustack: -o {fifo} is a FIFO nobody reads; ustack does not "
                          "wait for a reader (start it first)\n")
    assert res.returncode == 1 and res.stdout == ""
    assert took < REFUSED_WITHIN_S


def test_roots_own_fifo_with_a_reader_gets_the_events(chain, shared):
    fifo = shared / "out"
    os.mkfifo(fifo, 0o600)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)   # there before ustack opens it
    try:
        res = run_ustack("trace", f"uprobe:{chain}:d", "-c", f"{chain} 3", "-o", fifo)
        received = os.read(reader, 1 << 16)   # a few lines: within the pipe's buffer
    finally:
        os.close(reader)
    assert res.returncode == 0, res.stderr
    assert received.decode().count(f": uprobe:{chain}:d\n") == 3
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("name", ["/dev/stdout", "/dev/fd/1"])
def test_standard_output_by_its_name(chain, name):
    res = run_ustack("count", f"uprobe:{chain}:d", "-c", f"{chain} 2", "-o", name)
    assert res.returncode == 0, res.stderr
    assert "  d [chain]\n" in res.stdout


def test_every_directory_behind_a_planted_link_is_refused(shared, roots_dir):
    planted = plant("parent link", shared, roots_dir)
    res = run_ustack("profile", "-F", "99", "--every", "1", "-d", "1", "-o",
                     f"{planted.path.parent}/ev/", "-c", "sleep 1")
    assert res.returncode == 1 and len(res.stderr.splitlines()) == 1, res.stderr
    assert "is a symbolic link of another user (uid 65534)" in res.stderr
    assert planted.untouched()


def test_every_directory_of_another_user_is_refused(shared):
    as_nobody("mkdir", "-m", "777", shared / "ev")
    res = run_ustack("profile", "-F", "99", "--every", "1", "-d", "1", "-o",
                     f"{shared}/ev/", "-c", "sleep 1")
    assert res.stderr == (f"ustack: -o {shared}/ev/ is a directory of another user "
                          "(uid 65534); name a directory of yours\n")
    assert res.returncode == 1 and os.listdir(shared / "ev") == []


def test_a_cache_behind_a_planted_link_is_not_made(shared, roots_dir):
    """A cache directory reached through nobody's link is not used (the
    report is made without it), never made in root's directory."""
    planted = plant("parent link", shared, roots_dir)
    env = dict(ustack_env(), USTACK_CACHE_DIR=f"{planted.path.parent}/cache")
    res = run_ustack("report", RECORDING, "--objects", FIXTURES, "-f", "folded", env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout
    assert planted.untouched()
