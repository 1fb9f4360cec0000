"""A short run loads only what it uses. A one-hit trace of a stripped
program, whose stack the kernel walks, names its frames (libc's by name,
the program's by their CFI starts) without the DWARF unwinder, the line
tables or libelf: importing them and loading libelf was ~4 ms of its
~0.1 s of CPU. A program that runs no interpreter gets nothing of any
runtime (Python, V8, PHP, Perl, Ruby, HotSpot): their modules, objects
and names tables come with the first object of theirs the run meets."""
import re
import subprocess
import sys

import pytest

from helpers import ustack_env

NOT_NEEDED = ("ustack.unwind.dwarf", "ustack.unwind.cfi", "ustack.objfile.dwarf_lines",
              "ustack.native.libelf",
              # the readers of runtimes' frames in copied stacks
              "ustack.unwind.script_live", "ustack.unwind.script_readers",
              "ustack.unwind.v8_live",
              # argparse's translations: ustack speaks English (cli.py)
              "gettext")
# a runtime's own modules (capture/bpf_python, symbols/ruby, unwind/v8_runtime,
# ...); runtime_files, runtime_objects, runtime_passes and runtime_names
# only say whose a file is and make the rest when one is met
RUNTIME = r"python|v8|php|perl|ruby|hotspot|java|script|interpreter"


@pytest.fixture(scope="module")
def one_hit(tmp_path_factory):
    """A one-hit trace of echo: its output, then the modules of NOT_NEEDED
    and of the runtimes it imported."""
    code = ("import re, sys; from ustack.cli import main; "
            "status = main(['trace', 'syscall:write', '-c', 'echo hello']); "
            f"print(status, [m for m in {NOT_NEEDED!r} if m in sys.modules]); "
            f"print(sorted(m for m in sys.modules if m.startswith('ustack.') "
            f"and re.search({RUNTIME!r}, m)))")
    # a cache of its own, filled by the runs before (an empty cache parses
    # the vDSO's copy, libc and echo with libelf): the last run is the short
    # run a user repeats. A run's rows builders finish after it ends (niced:
    # later on a busy machine), so the runs before go on until one found
    # every object's rows cached
    cache = tmp_path_factory.mktemp("cache")
    env = dict(ustack_env(), USTACK_CACHE_DIR=str(cache))
    for _ in range(10):
        warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        if "built after the start" not in warm.stderr:
            break
    res = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    return res.stdout.splitlines(), res.stdout + res.stderr


def test_a_one_hit_trace_names_its_stack_without_unwinder_lines_or_libelf(one_hit):
    lines, said = one_hit
    assert lines[-2] == "0 []", said
    frames = [line for line in lines if line.startswith(" 0x")]
    assert any(" : write+0x" in f and f.endswith("[libc.so.6]") for f in frames), lines
    # echo is stripped: its frames are placed by their FDEs (headers read
    # without libelf)
    assert any(" : fn@0x" in f and f.endswith("[echo]") for f in frames), lines


def test_a_one_hit_trace_of_echo_imports_nothing_of_any_runtime(one_hit):
    lines, said = one_hit
    assert lines[-1] == "[]", said
    # every runtime is on by default: the run met none of them
    assert lines[-2].startswith("0 "), said


# what holds a -c command at its exit under ptrace (target/traced_command),
# and what walks a JVM's copied stacks: a profile of a running CPython needs
# neither, though its first deferred stacks come copied
NOT_PYTHONS = ("ustack.target.traced_command", "ustack.kernel.ptrace",
               "ustack.unwind.hotspot_live", "ustack.unwind.hotspot_runtime")


@pytest.fixture(scope="module")
def python_profile(tmp_path_factory):
    """A short profile (-p) of a busy CPython, once its cache is filled:
    its exit status and the modules of NOT_PYTHONS it imported, and what it said."""
    busy = subprocess.Popen([sys.executable, "-c",
                             "print('ready', flush=True)\nwhile True:\n    pass\n"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout.readline() == "ready\n"
        code = ("import sys; from ustack.cli import main; "
                f"status = main(['profile', '-F', '99', '-p', '{busy.pid}', '-d', '0.3']); "
                f"print(status, [m for m in {NOT_PYTHONS!r} if m in sys.modules])")
        cache = tmp_path_factory.mktemp("cache")
        env = dict(ustack_env(), USTACK_CACHE_DIR=str(cache))
        subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
        res = subprocess.run([sys.executable, "-c", code], env=env,
                             capture_output=True, text=True, timeout=60)
    finally:
        busy.kill()
        busy.wait()
    return res.stdout.splitlines(), res.stdout + res.stderr


def test_a_profile_of_a_running_python_imports_nothing_of_ptrace_or_jvms(python_profile):
    lines, said = python_profile
    # its Python frames merged in the kernel: the CPython was met
    assert any("<module>" in line for line in lines), said
    # only a -c command is held at its exit under ptrace; no process maps libjvm
    assert lines[-1] == "0 []", said
