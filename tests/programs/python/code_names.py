"""Prints the code objects of known functions (id(), the name and file the
interpreter gives them, and the line of every code unit by the interpreter's
own line table), then the frame blocked in wait_here, and waits for a line
on stdin: the test reads its memory meanwhile.

argv[1]: a directory where the module with non-ASCII names (and a
function whose lines are more than 255 apart) is written and imported."""
import dis
import importlib.util
import json
import os
import sys

LONG_GAP = 300                 # lines between the long function's statements

MODULE = (
    "def café(x):\n"                  # a latin-1 name
    "    return x + 1\n"
    "\n"
    "def 関数(x):\n"                   # UCS-2
    "    return x * 2\n"
    "\n"
    "def 𠀀(x):\n"                      # UCS-4 (stays itself under NFKC)
    "    return x - 3\n"
    "\n"
    "def long_function(n):\n"
    "    total = n\n"
    + "\n" * LONG_GAP
    + "    total += 1\n"
    + "\n" * LONG_GAP
    + "    total *= 2\n"
    "    return total\n"
)


class C:
    def m(self):
        return 1


def outer():
    def inner():
        return 2
    return inner


LAMBDA = lambda y: y * 3  # noqa: E731
NOT_CODE = bytes(4096)         # an object that is no code object: zeros


def unit_lines(code):
    """[index, line] of every 2-byte code unit, by the interpreter's table."""
    size = len(code.co_code) // 2
    if hasattr(code, "co_lines"):                   # 3.10+
        lines = {}
        for start, end, line in code.co_lines():
            for i in range(start // 2, end // 2):
                lines[i] = line
        return [[i, lines[i]] for i in range(size) if lines.get(i) is not None]
    starts = list(dis.findlinestarts(code))         # 3.8, 3.9: (byte offset, line)
    out, line = [], code.co_firstlineno
    for i in range(size):
        for offset, at in starts:
            if offset <= 2 * i:
                line = at
        out.append([i, line])
    return out


def describe(label, code):
    return {"label": label, "code": id(code), "co_name": code.co_name,
            "file": code.co_filename, "firstlineno": code.co_firstlineno,
            "lines": unit_lines(code)}


def report(facts):
    """Print the facts and where the caller is blocked (its call of this
    function: what a stack shows for it), then wait."""
    caller = sys._getframe(1)
    facts["waiting"] = {"code": id(caller.f_code), "index": caller.f_lasti // 2,
                        "line": caller.f_lineno, "co_name": caller.f_code.co_name}
    print(json.dumps(facts), flush=True)
    sys.stdin.readline()


def wait_here(facts):
    facts["at"] = "wait_here"
    report(facts)


def main():
    path = os.path.join(sys.argv[1], "módulo_名前_😀.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(MODULE)
    spec = importlib.util.spec_from_file_location("names", path)
    names = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(names)
    codes = {"method": C.m.__code__, "nested": outer().__code__,
             "lambda": LAMBDA.__code__, "latin1": getattr(names, "café").__code__,
             "ucs2": getattr(names, "関数").__code__, "ucs4": getattr(names, "𠀀").__code__,
             "long": names.long_function.__code__}
    facts = {"pid": os.getpid(), "version": list(sys.version_info[:2]),
             "not_code": id(NOT_CODE),
             "codes": [describe(label, code) for label, code in codes.items()]}
    wait_here(facts)


main()
