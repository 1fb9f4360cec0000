"""Names come from files and processes anyone can make: a function's name,
its file, a thread's name, a symbol of a binary. None of them may write a
control character into ustack's output (a NUL, a terminal escape, a newline
that would forge a frame line or end a folded line): each is shown escaped,
`\\x1b`, in every format."""
from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from helpers import O2_NOFP, build, nm_symbols, ok, parse_folded, run_ustack

pytestmark = pytest.mark.kernel

PROG = Path(__file__).resolve().parent / "programs" / "python" / "hostile_names.py"
PYTHON = "/usr/bin/python3.11"
CALLS = 7
SHOWN = "evil\\x00\\x1b[2J\\x0afake;frame"      # as the escapes print


def printable_lines(out: str) -> None:
    for line in out.split("\n"):
        assert line.isprintable(), repr(line)


@pytest.fixture(scope="module")
def python():
    if not Path(PYTHON).exists():
        pytest.skip(f"{PYTHON} is not installed")
    return PYTHON


def test_python_function_and_thread_names_are_escaped(python):
    res = ok(run_ustack("trace", "syscall:getppid", "-c", f"{python} {PROG} {CALLS}"))
    printable_lines(res.stdout)
    headers = [line for line in res.stdout.splitlines() if "syscall:getppid" in line]
    assert len(headers) == CALLS, res.stdout
    assert all(line.startswith("bad\\x1bcomm ") for line in headers), headers
    assert res.stdout.count(f": {SHOWN} [python] {SHOWN}.py:") == CALLS, res.stdout

    folded = ok(run_ustack("count", "syscall:getppid", "-f", "folded",
                           "-c", f"{python} {PROG} {CALLS}")).stdout
    printable_lines(folded)
    [(frames, n)] = [(f, n) for f, n in parse_folded(folded) if SHOWN.replace(";", ":")
                     in ";".join(f)]
    assert n == CALLS and frames[0] == "bad\\x1bcomm", folded


def test_symbol_names_of_a_binary_are_escaped(tmp_path):
    """A binary whose symbol `c` is renamed to ESC (one byte, in .strtab):
    its frame, and `ustack list`, show `\\x1b`."""
    full = build("chain", flags=O2_NOFP)
    prog = tmp_path / "chain"
    data = bytearray(Path(full).read_bytes())
    with open(full, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        strtab = elf.get_section(symtab["sh_link"])
        [sym] = [s for s in symtab.iter_symbols() if s.name == "c"]
        at = strtab["sh_offset"] + sym["st_name"]
        note = elf.get_section_by_name(".note.gnu.build-id")
        build_id_end = note["sh_offset"] + note["sh_size"]
    assert data[at:at + 2] == b"c\0"
    data[at] = 0x1b   # "c" may be the tail of a longer name too
    data[build_id_end - 1] ^= 0xff       # another binary: another build-id
    prog.write_bytes(bytes(data))
    prog.chmod(0o755)
    assert "\x1b" in nm_symbols(prog)

    res = ok(run_ustack("trace", "uprobe:" + str(prog) + ":d", "-c", f"{prog} 2"))
    printable_lines(res.stdout)
    assert res.stdout.count(" : \\x1b+0x") == 2, res.stdout

    listed = run_ustack("list", str(prog))
    assert listed.returncode == 0, listed.stderr
    printable_lines(listed.stdout)
    assert "\\x1b" in listed.stdout
