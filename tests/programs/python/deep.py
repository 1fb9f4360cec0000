"""Recursion DEPTH deep (argv[1]), then os.getppid() CALLS times (argv[2])
at the bottom: a trace of syscall:getppid has CALLS events whose Python
stack is dive x DEPTH, main, <module>. argv[3] (optional): seconds of
CPU it then spins at the bottom (for a profile)."""
import os
import sys

import time

depth, calls = int(sys.argv[1]), int(sys.argv[2])
spin = float(sys.argv[3]) if len(sys.argv) > 3 else 0
sys.setrecursionlimit(depth + 100)


def dive(n):
    if n > 1:
        return dive(n - 1)
    for _ in range(calls):
        os.getppid()
    end = time.process_time() + spin
    while time.process_time() < end:
        pass


def main():
    dive(depth)


main()
