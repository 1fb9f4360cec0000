"""PHP frames inside native stacks (bpf/php.h, capture/bpf_php.py,
symbols/php.py): `ustack profile` of Debian's php-cli (8.2, NTS) running
tests/programs/php/chain.php, whose call chain is known: the script's body
({main}) -> a() -> b() -> Spinner::spin(), spinning (and calling
cpu_seconds(), which calls the builtin getrusage()). Every sample taken
while the script runs must show that chain in order, with its file and the
line each frame is at, where the executor's C frame (execute_ex) was,
down to _start; with -c and with -p; --no-php leaves execute_ex."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import ustack
from helpers import (COPIED_STACKS, profile_copied,
                     ok, parse_folded, pprof, render, run_for_cpu, run_ustack, wait_until,
                     write_report)
from ustack.model import Frame, Stack, StackCount
from ustack.report.formats import ReportContext, stack_report
from ustack.unwind import php_runtime

pytestmark = pytest.mark.kernel

CHAIN_PHP = Path(__file__).parent / "programs" / "php" / "chain.php"
CHAIN = ["{main}", "a", "b", "Spinner::spin"]       # outermost first
# the line each frame is at: where it calls the next; spin: its loop
LINES = {"{main}": {36}, "a": {29}, "b": {25}, "Spinner::spin": {15, 16, 17},
         "cpu_seconds": {6, 7, 8, 9}}


def _php() -> str:
    php = shutil.which("php")
    if php is None:
        pytest.skip("php is not installed (apt-get install php-cli): no PHP frames to show")
    if php_runtime.object_interpreter(str(Path(php).resolve())) is None:
        pytest.skip(f"{php} is not a PHP version ustack follows (8.2 NTS)")
    return php


def _chain(frames) -> list:
    """The PHP frames of chain.php, outermost first."""
    return [f.function for f in reversed(frames) if f.kind == "php" and f.file == str(CHAIN_PHP)]


@pytest.fixture(scope="module")
def profiled():
    """One profile of `php chain.php 1` (-c: 1 s of CPU): its counted stacks."""
    php = _php()
    opts = ustack.Options(command="profile", events=["profile:hz:199"], backend="bpf",
                          cmdline=f"{php} {CHAIN_PHP} 1")
    with ustack.Session(opts) as run:
        counted = run.counts()
    return counted


def _running_script(counted) -> list:
    """The counts of samples taken while the script ran (php_execute_script
    in the native stack): start-up and shut-down are not judged."""
    return [c for c in counted
            if any(f.function == "php_execute_script" for f in c.stack.frames)]


def test_command_shows_the_chain_in_order_to_start(profiled):
    running = _running_script(profiled)
    samples = sum(c.count for c in running)
    whole = sum(c.count for c in running
                if _chain(c.stack.frames)[:4] == CHAIN
                and c.stack.frames[-1].function == "_start")
    assert samples >= 100, f"only {samples} samples while the script ran"
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples show {CHAIN}"


def test_php_frames_stand_where_execute_ex_was(profiled):
    """The frames sit between the executor's callers and its callees, with
    the line each one is at; no execute_ex frame is left beside them."""
    checked = 0
    for c in _running_script(profiled):
        names = [f.function for f in reversed(c.stack.frames)]
        if _chain(c.stack.frames)[:4] != CHAIN:
            continue
        checked += c.count
        assert "execute_ex" not in names, names
        at = names.index("{main}")
        assert names[at - 1] == "zend_execute", names
        for f in c.stack.frames:
            if f.kind == "php" and f.file:
                assert f.line in LINES[f.function], (f.function, f.line)
                assert f.module == "chain.php"
            elif f.kind == "php":       # a builtin's: cpu_seconds()' call of getrusage()
                assert (f.function, f.line) == ("getrusage", 0)
    assert checked >= 20, f"{checked} samples show the chain"


def test_pid_shows_the_chain(tmp_path):
    """-p: a php already running; folded output marks each PHP frame with
    its file and line, as Python's."""
    php = _php()
    ready = tmp_path / "ready"
    proc = subprocess.Popen([php, str(CHAIN_PHP), "0", str(ready)], stdout=subprocess.DEVNULL)
    try:
        wait_until(ready.exists, what="chain.php starting to spin")
        # each run ends once php has used its CPU seconds: ~199 a second
        # of its samples, however loaded the machine
        out = tmp_path / "p.folded"
        ok(run_for_cpu(proc.pid, "profile", "-F", "199", "-o", out, seconds=1.0))
        text = out.read_text()
        nopath = tmp_path / "nophp.folded"
        ok(run_for_cpu(proc.pid, "profile", "-F", "199", "--no-php", "-o", nopath,
                       seconds=0.5))
    finally:
        proc.kill()
        proc.wait()
    stacks = parse_folded(text)
    total = sum(n for _stack, n in stacks)
    expected = ["{main} (chain.php:36)", "a (chain.php:29)", "b (chain.php:25)"]
    whole = sum(n for stack, n in stacks
                if "_start" in stack and stack[stack.index("zend_execute") + 1:][:3] == expected
                and stack[stack.index("zend_execute") + 4].startswith("Spinner::spin (chain.php:"))
    assert total >= 100, text[-2000:]
    assert whole >= 0.9 * total, f"{whole} of {total}\n{text[-2000:]}"
    # --no-php: the executor as walked
    plain = nopath.read_text()
    assert "execute_ex" in plain and "chain.php" not in plain, plain[-2000:]


def test_text_report_marks_php_frames(profiled, tmp_path):
    """The text report labels a PHP frame as a Python one: `func [php] file:line`."""
    from ustack.report.text import frame_label
    spin = next(f for c in _running_script(profiled) for f in c.stack.frames
                if f.kind == "php" and f.function == "Spinner::spin")
    assert frame_label(spin) == f"Spinner::spin [php] {CHAIN_PHP}:{spin.line}"


def test_only_php_8_2_nts_is_followed():
    """The Zend API number says the version; a thread-safe (ZTS) build or
    another version gets no layout (its stacks stay native)."""
    assert php_runtime.api_number(b"\x00API20220829,NTS\x00") == 20220829
    assert php_runtime.api_number(b"\x00API20220829,TS\x00") is None
    assert php_runtime.object_interpreter("/bin/true") is None
    php = _php()
    interp = php_runtime.object_interpreter(str(Path(php).resolve()))
    assert interp.version == (8, 2)
    assert interp.execute_range[1] > interp.execute_range[0]


def _php_frame(function, file, line):
    return Frame(addr=0, module=os.path.basename(file), function=function, file=file,
                 line=line, kind="php")


# innermost first: Spinner::spin called by {main}, run by the executor
PHP_STACK = Stack((_php_frame("Spinner::spin", "/srv/app/chain.php", 15),
                   _php_frame("{main}", "/srv/app/chain.php", 36),
                   Frame(addr=0x401000, module="php8.2", function="zend_execute", offset=0x10,
                         path="/usr/bin/php8.2")))
CONTEXT = ReportContext(command="count", events=("profile:hz:99",))


def test_pprof_carries_php_function_file_and_line(tmp_path):
    """pprof: a PHP frame is a location of no mapping with one line, its
    function's system name `php::NAME:FILE` (a Python one's is `py::`)."""
    path = write_report("pprof", [StackCount("php", 7, PHP_STACK, 5)],
                        tmp_path / "php.pb.gz", CONTEXT)
    locations = pprof("-raw", path).split("\nLocations\n")[1].split("\nMappings\n")[0]
    assert [ln.split(": ", 1)[1] for ln in locations.splitlines()[:2]] == [
        "0x0 Spinner::spin /srv/app/chain.php:15 s=0(php::Spinner::spin:/srv/app/chain.php)",
        "0x0 {main} /srv/app/chain.php:36 s=0(php::{main}:/srv/app/chain.php)"]


def test_flame_graphs_mark_php_frames(tmp_path):
    """HTML: PHP frames are of their own kind (its legend says PHP), named
    `func (file:line)` as Python's; folded the same."""
    counts = [StackCount("php", 7, PHP_STACK, 5)]
    html = write_report("html", counts, tmp_path / "php.html", CONTEXT).read_text()
    assert '"php"' in html and "Spinner::spin (chain.php:15)" in html
    folded = render(stack_report("folded"), counts)
    assert "zend_execute;{main} (chain.php:36);Spinner::spin (chain.php:15) 5" in folded


def test_callbacks_from_builtins_stand_in_their_executor_calls():
    """usort() and array_map() call back into PHP through zend_call_function:
    each executor call's PHP frames stand where its execute_ex was, the
    builtins' C frames between them, so the chain reads in call order."""
    php = _php()
    script = Path(__file__).parent / "programs" / "php" / "callbacks.php"
    res = ok(run_ustack("trace", "syscall:getrusage", "-c", f"{php} {script}"))
    event = res.stdout.split("\n\n")[0].splitlines()
    labels = [line.split(" : ", 1)[1] for line in event[1:]]
    names = [label.split(" [")[0].split("+0x")[0] for label in labels]
    at = names.index("getrusage", 1)       # the PHP frame of the builtin, past libc's
    assert names[at:at + 3] == ["getrusage", "cmp", "zend_call_function"], names
    usort = names.index("usort")
    assert names[usort:usort + 4] == ["usort", "sorter", "K::{closure}",
                                      "zend_call_function"], names
    outer = names.index("array_map")
    assert names[outer:outer + 4] == ["array_map", "K::run", "{main}", "zend_execute"], names
    assert "execute_ex" not in names and names[-1] == "_start", names
    assert labels[at + 1] == f"cmp [php] {script}:6"


@pytest.mark.parametrize("copied", COPIED_STACKS)
def test_stacks_unwound_by_ustack_carry_the_chain(tmp_path, copied):
    """A rows table too small for php's rows (--unwind-memory 1): the
    kernel hands every stack over unwalked; --backend perf: every sample
    is a copy. ustack reads the PHP
    frames from the live process as it unwinds the copy, putting them
    where execute_ex was, named with their file and line."""
    rows = profile_copied(tmp_path, copied, f"{_php()} {CHAIN_PHP} 1")
    running = [(stack, n) for stack, n in rows
               if "php_execute_script" in stack]
    samples = sum(n for _stack, n in running)
    frames = [[f for f in stack if " (chain.php:" in f] for stack, _n in running]
    whole = sum(n for (stack, n), mine in zip(running, frames)
                if [f.split(" (chain.php:")[0] for f in mine][:4] == CHAIN
                and "execute_ex" not in stack)
    assert samples >= 100, running
    # (a sample whose frames were read while php ran a builtin stays C:
    # 99-100 % carry the chain on a quiet machine, fewer under load)
    assert whole >= 0.5 * samples, f"{whole} of {samples} samples show {CHAIN}"
    for mine in frames:
        for f in mine:
            name, line = f.split(" (chain.php:")
            assert int(line.rstrip(")")) in LINES[name], f


def test_a_recording_keeps_the_php_frames(tmp_path):
    """record keeps each PHP frame's names, copied while php ran: the
    report of the file shows the chain in order with each frame's line,
    where execute_ex was, down to _start."""
    rec = tmp_path / "chain.ustack"
    ok(run_ustack("record", "profile:hz:199", "-o", rec, "-c", f"{_php()} {CHAIN_PHP} 1"))
    res = run_ustack("report", "-f", "folded", rec)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    rows = [(stack, n) for stack, n in parse_folded(res.stdout) if "php_execute_script" in stack]
    samples = sum(n for _stack, n in rows)

    def chain(stack: list) -> list:
        return [tuple(f.removesuffix(")").split(" (chain.php:")) for f in stack
                if " (chain.php:" in f]
    whole = sum(n for stack, n in rows
                if [name for name, _line in chain(stack)][:4] == CHAIN and "_start" in stack
                and all(int(line) in LINES[name] for name, line in chain(stack)))
    assert samples >= 100, f"only {samples} samples while the script ran"
    assert whole >= 0.9 * samples, f"{whole} of {samples} samples show {CHAIN}"
    assert not [stack for stack, _n in parse_folded(res.stdout) if "execute_ex" in stack], \
        res.stdout[-2000:]
