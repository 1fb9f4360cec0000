"""A Python program that damages its own frame chain through ctypes while
it works (what a buggy C extension or a stray write can do), for the
frame walk: under <module> -> main -> outer_fn -> middle_fn -> leaf, leaf
calls os.getppid() once per line read from stdin (and says `called` after
each), with, by MODE:
  loop-self      leaf's `previous` pointing at leaf itself
  loop-ancestor  outer_fn's `previous` pointing at leaf (leaf ->
                 middle_fn -> outer_fn -> leaf ...: a cycle of three)
  bad-code       middle_fn's code object pointer pointing at a buffer of
                 0x41 bytes (readable memory that is no code object)
Usage: broken_chain.py MODE. Once the chain is damaged it writes one JSON
line on stdout: its pid and the address of each function's code object
(the readiness signal); when stdin closes it mends the chain, prints how
many lines it read and exits 0.
CPython 3.11-3.13 (their _PyInterpreterFrame layouts)."""
import ctypes
import json
import os
import sys

# PyFrameObject.f_frame (3.11-3.13), then per version the offsets of
# _PyInterpreterFrame's `previous` and code object pointer
F_FRAME = 24
LAYOUT = {(3, 11): (48, 32), (3, 12): (8, 0), (3, 13): (8, 0)}
PREVIOUS, CODE = LAYOUT[sys.version_info[:2]]
GARBAGE = ctypes.create_string_buffer(b"\x41" * 4096)


def interpreter_frame(depth: int) -> int:
    """The _PyInterpreterFrame address of the caller `depth` frames up."""
    return ctypes.c_void_p.from_address(id(sys._getframe(depth + 1)) + F_FRAME).value


def word(address: int) -> ctypes.c_void_p:
    return ctypes.c_void_p.from_address(address)


def leaf(mode):
    me, middle, outer = interpreter_frame(0), interpreter_frame(1), interpreter_frame(2)
    if mode == "loop-self":
        slot, bad = word(me + PREVIOUS), me
    elif mode == "loop-ancestor":
        slot, bad = word(outer + PREVIOUS), me
    else:
        slot, bad = word(middle + CODE), ctypes.addressof(GARBAGE)
    good = slot.value
    slot.value = bad
    try:
        print(json.dumps({"pid": os.getpid(), "codes": {
            f.__name__: id(f.__code__) for f in (main, outer_fn, middle_fn, leaf)}}),
            flush=True)
        calls = 0
        for _line in sys.stdin:
            os.getppid()
            calls += 1
            print("called", flush=True)
    finally:
        slot.value = good            # mended before any frame returns through it
    print(calls, flush=True)


def middle_fn(mode):
    return leaf(mode)


def outer_fn(mode):
    return middle_fn(mode)


def main():
    mode = sys.argv[1]
    if mode not in ("loop-self", "loop-ancestor", "bad-code"):
        sys.exit(f"unknown mode {mode}")
    outer_fn(mode)


if __name__ == "__main__":
    main()
