"""A value built once per key: other threads wait for the builder; the
builder's own thread asking again (a signal handler run in the middle of
the build) gets a value instead of waiting for itself."""
import threading

from ustack.objfile.built_once import BuiltOnce


def test_a_build_asking_its_own_key_again_ends():
    once, got = BuiltOnce(), []

    def build():
        # what SIGCHLD's handler does when it interrupts the build
        return once.get("libpython", lambda: "inner") + "+outer"

    asker = threading.Thread(target=lambda: got.append(once.get("libpython", build)),
                             daemon=True)
    asker.start()
    asker.join(10)
    assert got == ["inner+outer"]
    assert once.get("libpython", lambda: "again") == "inner+outer"


def test_threads_asking_at_once_share_one_build():
    once, builds, start = BuiltOnce(), [], threading.Barrier(4)

    def build():
        builds.append(1)
        return len(builds)

    def ask(out):
        start.wait()
        out.append(once.get("libc", build))

    got: list = []
    askers = [threading.Thread(target=ask, args=(got,)) for _ in range(4)]
    for t in askers:
        t.start()
    for t in askers:
        t.join(10)
    assert got == [1, 1, 1, 1] and builds == [1]
