"""Recursion DEPTH deep (argv[1]), then os.getppid() CALLS times (argv[2])
at the bottom: a trace of syscall:getppid has CALLS events whose Python
stack is dive x DEPTH, main, <module>."""
import os
import sys

depth, calls = int(sys.argv[1]), int(sys.argv[2])
sys.setrecursionlimit(depth + 100)


def dive(n):
    if n > 1:
        return dive(n - 1)
    for _ in range(calls):
        os.getppid()


def main():
    dive(depth)


main()
