"""Two threads parked under known Python chains, for `ustack dump`:
<module> -> main -> outer -> inner -> sys.stdin.readline(), and a thread
side -> side_outer -> side_inner -> a lock's acquire(). Prints "ready"
once the thread holds its place; exits at the end of stdin."""
import sys
import threading

gate = threading.Lock()
gate.acquire()
started = threading.Event()


def side_inner():
    started.set()
    gate.acquire()


def side_outer():
    side_inner()


def side():
    side_outer()


def inner():
    return sys.stdin.readline()


def outer():
    return inner()


def main():
    t = threading.Thread(target=side, name="side", daemon=True)
    t.start()
    started.wait()
    print("ready", flush=True)
    while outer():
        print("line", flush=True)


main()
