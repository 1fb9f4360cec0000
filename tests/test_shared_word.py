"""A ring buffer's positions are shared with the kernel, which reads and
writes them on another CPU while ustack runs: each load and store of one
must be whole. A C program (tests/programs/word_share.c) stands in for the
kernel on the other side of a shared mapping."""
from __future__ import annotations

import mmap
import os
import subprocess

import pytest

from helpers import build
from ustack.kernel.shared_word import SharedWord

A, B, STOP = 0x1111111111111111, 0x2222222222222222, 0x3333333333333333
STORES = 1_000_000


@pytest.fixture
def shared(tmp_path):
    path = tmp_path / "word"
    path.write_bytes(bytes(mmap.PAGESIZE))
    with open(path, "r+b") as f:
        mapping = mmap.mmap(f.fileno(), mmap.PAGESIZE, mmap.MAP_SHARED)
    yield path, mapping
    mapping.close()


def started(mode: str, path, *values) -> subprocess.Popen:
    proc = subprocess.Popen([str(build("word_share")), mode, str(path),
                             *(hex(v) for v in values)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs a reader on another CPU")
def test_a_store_is_never_seen_half_done(shared):
    """The consumer position a reader on another CPU sees is always one
    that was written (struct's pack_into wrote 0 first, then byte by
    byte: the kernel took the ring for full and lost events)."""
    path, mapping = shared
    word = SharedWord(mapping, 0)
    word.store(A)
    watcher = started("watch", path, A, B, STOP)
    try:
        for _ in range(STORES // 2):
            word.store(B)
            word.store(A)
        word.store(STOP)
        out, _ = watcher.communicate(timeout=30)
    finally:
        watcher.kill()
        word.release()
    assert out == "torn 0\n"


@pytest.mark.skipif(os.cpu_count() < 2, reason="needs a writer on another CPU")
def test_a_load_is_never_half_old(shared):
    """A head the kernel moves while it is read is read as one value, the
    old or the new, never bytes of both."""
    path, mapping = shared
    word, stop = SharedWord(mapping, 0), SharedWord(mapping, 8)
    writer = started("write", path, A, B)
    try:
        seen = {word.load() for _ in range(STORES)}
    finally:
        stop.store(1)
        writer.wait(timeout=30)
        word.release()
        stop.release()
    assert seen <= {A, B} and seen


def test_a_word_must_be_aligned(shared):
    with pytest.raises(ValueError, match="aligned"):
        SharedWord(shared[1], 4)
