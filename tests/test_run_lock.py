"""kernel/run_lock.py: the lock file that proves a run alive is made only
in a directory of root's that nobody else can write, never through a
link; a name is judged dead only when its lock is free."""
from __future__ import annotations

import fcntl
import os

import pytest

from ustack.kernel import run_lock

pytestmark = pytest.mark.kernel            # root: the lock directory is root's


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    d = tmp_path / "locks"
    monkeypatch.setattr(run_lock, "LOCK_DIR", str(d))
    return d


def test_hold_makes_a_private_lock_file_and_release_removes_it(lock_dir):
    fd = run_lock.hold()
    try:
        assert fd is not None
        assert oct(lock_dir.stat().st_mode & 0o777) == oct(0o700)
        path = lock_dir / run_lock.tracing_name()
        assert oct(path.stat().st_mode & 0o777) == oct(0o600)
        assert run_lock.lock_if_dead(run_lock.tracing_name()) is None   # we live
    finally:
        run_lock.release()
    assert not (lock_dir / run_lock.tracing_name()).exists()


def test_a_link_planted_at_the_lock_file_is_not_followed(lock_dir, tmp_path):
    lock_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, lock_dir / run_lock.tracing_name())
    assert run_lock.hold() is None
    assert victim.read_text() == "keep"
    assert (lock_dir / run_lock.tracing_name()).is_symlink()


@pytest.mark.parametrize("plant", ["link", "writable"])
def test_a_directory_others_could_write_or_a_link_is_not_used(lock_dir, tmp_path, plant):
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    if plant == "link":
        os.symlink(real, lock_dir)
    else:
        lock_dir.mkdir()
        os.chmod(lock_dir, 0o777)
    assert run_lock.hold() is None
    assert os.listdir(real) == [] and (plant == "link" or os.listdir(lock_dir) == [])


def test_a_free_lock_proves_death_and_a_held_one_life(lock_dir):
    lock_dir.mkdir(mode=0o700)
    name = "ustack_999999999"
    fd = os.open(lock_dir / name, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)            # another process's run, alive
    try:                                      # (a flock is per open file)
        assert run_lock.lock_if_dead(name) is None
    finally:
        os.close(fd)                          # the run died
    dead = run_lock.lock_if_dead(name)
    assert dead is not None
    run_lock.forget(name, dead)
    assert not (lock_dir / name).exists()
