"""Two threads blocked in known Python chains, for `ustack dump`:
  main thread   <module> -> main -> outer -> sorted() -> key_of -> block_main
                (reading stdin)
  worker thread Thread._bootstrap ... run -> work -> t_outer -> t_inner
                (reading a pipe)
It prints one JSON line once the worker exists and main is about to read
(pid, both native thread ids, the line of each call the frames stand at).
A line on stdin goes on to the worker; both then end with fixed output."""
import json
import os
import sys
import threading

R, W = os.pipe()


def t_inner():
    return os.read(R, 64)  # LINE t_inner


def t_outer():
    return t_inner()  # LINE t_outer


def work():
    data = t_outer()  # LINE work
    print("worker got", data.decode().strip(), flush=True)


def lines():
    """Where each function's frame stands: the line marked `LINE name`."""
    out = {}
    with open(__file__) as f:
        for n, text in enumerate(f, 1):
            if "# LINE " in text and "out[" not in text:
                out[text.split("# LINE ")[1].strip()] = n
    return out


def block_main():
    print(json.dumps({"pid": os.getpid(), "main": threading.get_native_id(),
                      "worker": worker.native_id, "lines": lines()}), flush=True)
    return sys.stdin.readline()  # LINE block_main


def key_of(x):
    got = block_main() if x == 3 else ""  # LINE key_of
    if got:
        os.write(W, got.encode())
    return -x


def outer():
    return sorted([1, 2, 3], key=key_of)  # LINE outer


def main():
    result = outer()  # LINE main
    worker.join()
    print("sorted", result, flush=True)


worker = threading.Thread(target=work, daemon=True)   # a failed main ends the program
worker.start()
main()  # LINE <module>
