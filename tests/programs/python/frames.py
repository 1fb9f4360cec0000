"""A busy Python program whose stacks are known: MODE picks where the time
goes, each under <module> -> main -> outer -> middle -> leaf:
  busy       leaf's own loop
  sorted     key_of, called back by the builtin sorted() that leaf calls
  generator  numbers(), a generator leaf iterates
  exception  handle(), called in leaf's except block
  threads    work_a, work_b, work_c, each in a thread of its own; timed,
             each thread works until it has had SECONDS/2 of CPU itself
             (not of the clock: on a loaded machine each thread still
             runs, and is sampled, as long)
  write      leaf prints (libc's write under print)
Usage: frames.py MODE SECONDS|stdin [FACTS_FILE]. It works for SECONDS of
its main thread's CPU time (a profile sees as many samples however loaded
the machine is), or until stdin closes; when it starts working it writes,
as one JSON line to FACTS_FILE (else stdout), its pid and the address of
each function's code object (id(code)): the readiness signal, and what a
test matches frames against."""
import json
import os
import sys
import threading
import time


def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def key_of(x):
    return spin(40) + x


def numbers(n):
    for i in range(n):
        yield spin(40) + i


def handle(err):
    return spin(2000)


def work_a():
    return spin(2000)


def work_b():
    return spin(2000)


def work_c():
    return spin(2000)


def threaded(work):
    # the CPU clock read after every 10th call only: a system call's time
    # would be threaded()'s own, not work()'s
    calls = 0
    while calls % 10 or not (time.thread_time() >= _cpu_each[0] if _cpu_each[0] else done()):
        work()
        calls += 1


def leaf(mode):
    if mode == "busy":
        return spin(2000)
    if mode == "sorted":
        return sorted(range(50), key=key_of)
    if mode == "generator":
        return sum(numbers(50))
    if mode == "exception":
        try:
            raise ValueError(mode)
        except ValueError as err:
            return handle(err)
    if mode == "write":
        print("x" * 64, file=OUT, flush=True)
        return 0
    raise SystemExit(f"no mode {mode}")


def middle(mode):
    return leaf(mode)


def outer(mode):
    return middle(mode)


_end = [None]
_cpu_each = [None]        # threads, timed: the CPU seconds each thread works
_closed = threading.Event()


_next_look = [0.0]         # timed: when to read the thread's CPU clock again


def done():
    if _end[0] is None:
        return _closed.is_set()
    # the CPU clock is a system call (the wall clock is not): read it every
    # 5 ms, so that the program's time stays in its own functions
    now = time.monotonic()
    if now < _next_look[0]:
        return False
    _next_look[0] = now + 0.005
    return time.thread_time() >= _end[0]


def main(mode, seconds, facts):
    names = ("main", "outer", "middle", "leaf", "spin", "key_of", "numbers", "handle",
             "work_a", "work_b", "work_c", "threaded")
    codes = {name: id(globals()[name].__code__) for name in names}
    codes["<module>"] = id(sys._getframe(1).f_code)
    if seconds == "stdin":
        threading.Thread(target=lambda: (sys.stdin.read(), _closed.set()),
                         daemon=True).start()
    else:
        _end[0] = time.thread_time() + float(seconds)
    workers = []
    if mode == "threads" and seconds != "stdin":
        _cpu_each[0] = float(seconds) / 2
    if mode == "threads":
        workers = [threading.Thread(target=threaded, args=(w,), name=w.__name__)
                   for w in (work_a, work_b, work_c)]
        for t in workers:
            t.start()
    line = json.dumps({"pid": os.getpid(), "codes": codes,
                       "version": list(sys.version_info[:2])})
    if facts:
        with open(facts + ".tmp", "w") as f:
            f.write(line + "\n")
        os.rename(facts + ".tmp", facts)
    else:
        print(line, flush=True)
    if workers:
        for t in workers:
            t.join()
        return
    while not done():
        outer(mode)


OUT = open(os.devnull, "w")
main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
