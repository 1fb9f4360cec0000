"""Compiles, runs and frees throwaway functions, one after another: each
has a name and a first line of its own, all in one file ("throwaway.py"),
and calls os.getppid() once, so a trace of syscall:getppid has one event
per function, in the order they ran. A code object freed leaves its
memory to the next one: a frame named by address alone gets the wrong
name.

argv[1]: how many functions; argv[2]: a file where the order they ran in
is written at the end (one name a line); argv[3] (optional): how deep
each recurses before it calls getppid (its frames all named after it);
argv[4] (optional): loop iterations each runs first (a profile's samples
land in them)."""
import os
import sys

count, log_path = int(sys.argv[1]), sys.argv[2]
depth = int(sys.argv[3]) if len(sys.argv) > 3 else 0
spin = int(sys.argv[4]) if len(sys.argv) > 4 else 0
ran = []


def run_one(i: int) -> None:
    name = f"thrown_{i}"
    # a first line of its own: blank lines before the def
    src = "\n" * (i % 97) + (f"def {name}(n):\n"
                             f"    for _ in range(spin):\n"
                             f"        pass\n"
                             f"    if n:\n"
                             f"        return {name}(n - 1)\n"
                             f"    return getppid()\n")
    space = {"getppid": os.getppid, "spin": spin}
    exec(compile(src, "throwaway.py", "exec"), space)
    space[name](depth)
    ran.append(name)


def main() -> None:
    for i in range(count):
        run_one(i)
    with open(log_path, "w") as f:
        f.write("\n".join(ran) + "\n")


main()
