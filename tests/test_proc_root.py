"""Files as another root sees them (kernel/proc_root.py), without a real
container: a directory stands for the root, a dead pid for a process gone
with its container."""
from __future__ import annotations

import os
import subprocess

import pytest

from helpers import build
from ustack.kernel.proc_root import lasting_path, ns_pids, open_in_root
from ustack.model import Mapping, MmapEvent
from ustack.objfile.elf import ElfImage
from ustack.symbols.perfmap import PerfMap
from ustack.target.mappings import NOT_HERE, MappingTracker


def test_absolute_symlink_and_dotdot_stay_inside_the_root(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("inside\n")
    (root / "tmp").symlink_to("/etc")           # absolute: /etc of the root
    fd = open_in_root(str(root), "/tmp/hostname")
    with os.fdopen(fd) as f:
        assert f.read() == "inside\n"
    with pytest.raises(FileNotFoundError):      # not the host's /etc/passwd
        open_in_root(str(root), "/tmp/passwd")
    with pytest.raises(FileNotFoundError):
        open_in_root(str(root), "/../../../../etc/passwd")


def test_perf_map_behind_a_symlink_out_of_the_root_is_not_read(tmp_path):
    bait = tmp_path / "bait"
    bait.mkdir()
    (bait / "perf-7.map").write_text("1000 100 BAIT\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "tmp").symlink_to(str(bait))         # leads out only if followed from here
    said = []
    assert PerfMap("/tmp/perf-7.map", root=str(root), warn=said.append).lookup(0x1010) is None
    (root / "tmp").unlink()
    (root / "tmp").mkdir()
    (root / "tmp" / "perf-7.map").write_text("1000 100 inside\nnot a line\n")
    pm = PerfMap("/tmp/perf-7.map", root=str(root), warn=said.append)
    assert pm.lookup(0x1010).name == "inside"
    assert said == [f"{root}/tmp/perf-7.map: malformed lines skipped"]


def test_proc_path_outlives_its_process():
    """An object first opened as /proc/PID/exe is read after PID exits."""
    child = subprocess.Popen([str(build("threads")), "-"], stdin=subprocess.PIPE)
    try:
        path = lasting_path(f"/proc/{child.pid}/exe")
    finally:
        child.communicate(b"\n")
    assert path.startswith("/proc/self/fd/")
    with open(path, "rb") as f:
        assert f.read(4) == b"\x7fELF"


def test_ns_pids_of_a_process_outside_containers():
    assert ns_pids(os.getpid()) == (os.getpid(),)
    assert ns_pids(2 ** 22 + 1) == ()


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_mapping_of_a_gone_process_is_checked_by_build_id():
    """A process gone before its MMAP2 was applied: the host's file at its
    path is used only if it has the build-id the kernel named."""
    lib = str(build("plugin", kind="shared"))
    own = ElfImage.open(lib).build_id
    tracker = MappingTracker()
    pid = _dead_pid()
    tracker.apply(MmapEvent(pid, pid, Mapping(0x1000, 0x2000, 0, lib, build_id=own)))
    tracker.apply(MmapEvent(pid, pid, Mapping(0x3000, 0x4000, 0, lib, build_id="ab" * 20)))
    assert tracker.find(pid, 0x1000).open_path == lib
    assert tracker.find(pid, 0x3000).open_path == NOT_HERE
