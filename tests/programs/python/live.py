"""Python that changes while it is profiled: threads, forked workers, a
short run. Each function works until it has had its share of CPU itself
(thread_time), so a loaded machine changes how long it runs, not how
much of it is sampled.
Usage: live.py MODE CPU_SECONDS READY_FILE
  threads  main waits 0.5 s, then starts 8 threads, each running
           pool_worker -> pool_task until it had CPU_SECONDS of CPU
  requests a thread per request, 4 at a time, each running request ->
           request_task for 10 ms of CPU, until the requests had
           CPU_SECONDS (a threaded server's shape: a new thread often
           gets an ended one's stack, and its fsbase)
  fork     the parent waits 0.5 s, then forks 4 workers, each running
           forked_worker -> forked_task for CPU_SECONDS of CPU
  short    short_main -> short_task (getppid, then a loop) and short_wait
           (a 0.5 ms sleep) in turn for CPU_SECONDS of CPU, then exits
READY_FILE gets "ready PID" once the work has started (the threads or
workers all running): the signal a test waits for."""
import os
import sys
import threading
import time


def spin(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def pool_task():
    return spin(3000)


def pool_worker(cpu, started):
    started.release()
    end = time.thread_time() + cpu
    while time.thread_time() < end:
        pool_task()


def request_task():
    return spin(3000)


def request():
    end = time.thread_time() + 0.01
    while time.thread_time() < end:
        request_task()


def forked_task():
    return spin(3000)


def forked_worker(cpu):
    end = time.thread_time() + cpu
    while time.thread_time() < end:
        forked_task()


def short_task():
    os.getppid()
    return spin(3000)


def short_wait():
    time.sleep(0.0005)


def short_main(cpu):
    end = time.thread_time() + cpu
    while time.thread_time() < end:
        short_task()
        short_wait()


def ready(path):
    with open(path + ".part", "w") as f:
        f.write(f"ready {os.getpid()}\n")
    os.rename(path + ".part", path)


def main():
    mode, cpu, path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    if mode == "threads":
        time.sleep(0.5)
        started = threading.Semaphore(0)
        pool = [threading.Thread(target=pool_worker, args=(cpu, started)) for _ in range(8)]
        for t in pool:
            t.start()
        for _ in pool:
            started.acquire()
        ready(path)
        for t in pool:
            t.join()
    elif mode == "requests":
        ready(path)
        for _ in range(int(cpu / 0.04) + 1):
            batch = [threading.Thread(target=request) for _ in range(4)]
            for t in batch:
                t.start()
            for t in batch:
                t.join()
    elif mode == "fork":
        time.sleep(0.5)
        pids = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                forked_worker(cpu)
                os._exit(0)
            pids.append(pid)
        ready(path)
        for pid in pids:
            os.waitpid(pid, 0)
    elif mode == "short":
        ready(path)
        short_main(cpu)


if __name__ == "__main__":
    main()
