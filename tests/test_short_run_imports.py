"""A short run loads only what it uses. A one-hit trace of a stripped
program, whose stack the kernel walks, names its frames (libc's by name,
the program's by their CFI starts) without the DWARF unwinder, the line
tables or libelf: importing them and loading libelf was ~4 ms of its
~0.1 s of CPU."""
import subprocess
import sys

from helpers import ustack_env

NOT_NEEDED = ("ustack.unwind.dwarf", "ustack.unwind.cfi", "ustack.objfile.dwarf_lines",
              "ustack.native.libelf",
              # the readers of runtimes' frames in copied stacks
              "ustack.unwind.script_live", "ustack.unwind.script_readers",
              "ustack.unwind.v8_live")


def test_a_one_hit_trace_names_its_stack_without_unwinder_lines_or_libelf(tmp_path):
    code = ("import sys; from ustack.cli import main; "
            "status = main(['trace', 'syscall:write', '-c', 'echo hello']); "
            f"print(status, [m for m in {NOT_NEEDED!r} if m in sys.modules])")
    # a cache of its own, filled by a first run (an empty cache parses the
    # vDSO's copy, libc and echo with libelf): the second run is the short
    # run a user repeats
    env = dict(ustack_env(), USTACK_CACHE_DIR=str(tmp_path / "cache"))
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    res = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    lines = res.stdout.splitlines()
    assert lines[-1] == "0 []", res.stdout + res.stderr
    frames = [line for line in lines if line.startswith(" 0x")]
    assert any(" : write+0x" in f and f.endswith("[libc.so.6]") for f in frames), lines
    # echo is stripped: its frames are placed by their FDEs (headers read
    # without libelf)
    assert any(" : fn@0x" in f and f.endswith("[echo]") for f in frames), lines
