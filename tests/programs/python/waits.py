"""A Python program that waits, calls C and leaks in known chains, each
under <module> -> main -> outer -> middle -> leaf, ROUNDS times:
  sleep    nap() sleeps 2 ms (time.sleep)
  getppid  ask() calls os.getppid(), then leaf sleeps 1 ms
  leak     grab() leaks a BLOCK-byte block from libc's malloc (ctypes),
           then leaf sleeps 1 ms
Usage: waits.py MODE - : writes its facts as one JSON line to stdout, waits
for a line on stdin, works, writes "done" and waits until stdin closes (a
process ustack attaches to, alive while ustack reads what it saw);
waits.py MODE FACTS_FILE [N]: writes the facts to FACTS_FILE, runs the
chain once (or N times), says "bye" on stderr and exits with status 3
(~50 ms in all: a short -c command). The facts: its pid, version and the
address of each function's code object (id(code)), what a test matches
frames against."""
import ctypes
import json
import os
import sys
import time

ROUNDS = 20
BLOCK = 4096
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
kept = []


def nap():
    time.sleep(0.002)


def ask():
    return os.getppid()


def grab():
    kept.append(libc.malloc(BLOCK))


def leaf(mode):
    if mode == "sleep":
        return nap()
    if mode == "getppid":
        ask()
    elif mode == "leak":
        grab()
    else:
        raise SystemExit(f"no mode {mode}")
    time.sleep(0.001)


def middle(mode):
    return leaf(mode)


def outer(mode):
    return middle(mode)


def main(mode, where, rounds):
    names = ("main", "outer", "middle", "leaf", "nap", "ask", "grab")
    codes = {name: id(globals()[name].__code__) for name in names}
    codes["<module>"] = id(sys._getframe(1).f_code)
    line = json.dumps({"pid": os.getpid(), "codes": codes,
                       "version": list(sys.version_info[:2])})
    if where == "-":
        print(line, flush=True)
        sys.stdin.readline()
    else:
        with open(where + ".tmp", "w") as f:
            f.write(line + "\n")
        os.rename(where + ".tmp", where)
    for _ in range(ROUNDS if where == "-" else rounds):
        outer(mode)
    if where == "-":
        print("done", flush=True)
        sys.stdin.read()
    else:
        print("bye", file=sys.stderr)
        sys.exit(3)


ROUNDS_GIVEN = int(sys.argv[3]) if len(sys.argv) > 3 else 1
main(sys.argv[1], sys.argv[2], ROUNDS_GIVEN)
