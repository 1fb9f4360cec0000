"""A run's closer is a forked child (capture/closer.py): a lock that
another thread of the run held at the fork must be free there, or the
closer waits for ever (a node offcpu run's closer hung on the JS maps'
lock while the harvest thread held it)."""
import os
import threading

from ustack.capture.fork_safe_lock import ForkSafeLock


def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child():
    lock = ForkSafeLock()
    held, done = threading.Event(), threading.Event()

    def holder():
        with lock:
            held.set()
            done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:                     # the child: the holder thread is gone
            os._exit(0 if lock.acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert not lock.acquire(blocking=False)     # still held here
    finally:
        done.set()
        t.join()
    assert lock.acquire(blocking=False)
    lock.release()
