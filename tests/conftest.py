"""pytest setup: kernel-feature skips and the "leave no trace" check.

- Mark tests that attach probes with @pytest.mark.kernel (or request the
  `kernel` fixture): they skip, with the reason printed in the summary, when
  not root or when the kernel has no uprobe PMU.
- After every test, `no_leftovers` (autouse) fails the test if it left
  behind a uprobe/dynamic event or tracefs instance of a ustack run it
  started (named ustack_<pid>: the pids helpers.popen_ustack recorded, and
  pytest's own for in-process runs; other sessions' runs, even killed
  ones, are not this test's), changed trace_options, or a live process it
  started. Leaked processes are killed
  and trace_options restored so that one failure does not cascade.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import helpers`
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import helpers  # noqa: E402  (after the path is set)
from ustack.capture.closer import NAME as CLOSER  # noqa: E402

TRACEFS = Path("/sys/kernel/tracing")
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
# Every process a test starts inherits this variable (value unique per test);
# it is how leaked processes are found, even after they are re-parented.
TEST_TAG = "USTACK_TEST_TAG"


@pytest.hookimpl(tryfirst=True)  # before the terminal reporter reads reportchars
def pytest_configure(config):
    config.addinivalue_line("markers", "kernel: needs root and the uprobe PMU")
    config.addinivalue_line("markers", "alone: runs after the parallel rest, by itself "
                            "(.ci/run): its result depends on what else the machine runs")
    # Always list skip reasons in the summary: a skip is never silent.
    if "s" not in config.option.reportchars and "a" not in config.option.reportchars:
        config.option.reportchars += "s"
    if os.geteuid() == 0 and not (TRACEFS / "trace_options").exists():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)],
                       capture_output=True)


def pytest_collection_modifyitems(config, items):
    """A run over the whole machine sees every process, the other workers'
    busy programs, browsers and node included: such tests (their name or
    their file's says "system" or "machine") run alone."""
    for item in items:
        if "system" in item.nodeid or "machine" in item.nodeid:
            item.add_marker(pytest.mark.alone)


def kernel_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (perf_event_open on uprobes, tracefs)"
    if not UPROBE_PMU.exists():
        return f"kernel has no uprobe PMU ({UPROBE_PMU} missing)"
    if not (TRACEFS / "uprobe_events").exists():
        return f"tracefs with uprobe_events not available at {TRACEFS}"
    return None


def pytest_runtest_setup(item):
    if item.get_closest_marker("kernel") and (reason := kernel_skip_reason()):
        pytest.skip(reason)


@pytest.fixture
def kernel():
    """Request this fixture (or use @pytest.mark.kernel) to require root + uprobes."""
    if reason := kernel_skip_reason():
        pytest.skip(reason)


# --- leak check -------------------------------------------------------------

def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # not root, or file absent on this kernel
        return ""


_OWNER = re.compile(r"\bustack_(\d+)(?!\d)")
_BUILDER = re.compile(r"-m ustack\.(?:objfile\.function_child|unwind\.rows_builder) ")


def _alive(pid: int) -> bool:
    """Whether process `pid` is there and not a zombie."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _owned(name: str, pids: set[int]) -> bool:
    """Whether a ustack_<pid> name (a probe group or instance) belongs to
    one of `pids`."""
    m = _OWNER.search(name)
    return m is not None and int(m.group(1)) in pids


def _tracefs_state(pids: set[int]) -> dict[str, set[str]]:
    """The probe events and instances of the ustack runs `pids`, and the
    global trace_options."""
    events = {line for f in ("uprobe_events", "dynamic_events")
              for line in _read(TRACEFS / f).splitlines()
              if _owned(line.split()[0] if line.split() else "", pids)}
    try:
        instances = {p.name for p in (TRACEFS / "instances").iterdir()
                     if _owned(p.name, pids)}
    except OSError:
        instances = set()
    return {"events": events, "instances": instances,
            "trace_options": set(_read(TRACEFS / "trace_options").split())}


def _test_processes(tag: str, old_children: set[int]) -> dict[int, str]:
    """Live (non-zombie) processes the test started: those whose environment
    carries our tag, and new direct children (in case a test cleared env)."""
    found = {}
    needle = f"{TEST_TAG}={tag}".encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            state, ppid = (d / "stat").read_text().rsplit(")", 1)[1].split()[:2]
            child = int(ppid) == os.getpid() and int(d.name) not in old_children
            if not child and needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            if state == "Z":
                continue  # exited, only waiting to be reaped: holds nothing
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(d.name)] = cmd.strip()
        except OSError:  # exited meanwhile, or a kernel thread
            continue
    return found


def _closers(procs: dict) -> list:
    """Of these processes, ustack's detached closers (see capture/closer.py)."""
    return [pid for pid in procs if _read(Path(f"/proc/{pid}/comm")).strip() == CLOSER]


def _children() -> set[int]:
    """Direct children of this pytest process (any thread's)."""
    me, pids = str(os.getpid()), set()
    for d in Path("/proc").glob("[0-9]*"):
        if _read(d / "stat").rsplit(")", 1)[-1].split()[1:2] == [me]:
            pids.add(int(d.name))
    return pids


@pytest.fixture
def own_object_cache(tmp_path, monkeypatch):
    """A cache directory of the test's own (tmp_path/cache), with objects
    and CFI tables read afresh; the builders the test started are stopped
    after it (a builder still running is the test's process: ended before
    the leftover check judges it), and any left by another test of this
    worker before it."""
    from ustack.objfile import builders
    from ustack.objfile.elf import ElfImage
    from ustack.unwind.cfi import UnwindTable
    builders.stop_all()
    monkeypatch.setenv("USTACK_CACHE_DIR", str(tmp_path / "cache"))
    ElfImage.clear_cache()
    UnwindTable.clear_cache()
    yield
    builders.stop_all()
    ElfImage.clear_cache()
    UnwindTable.clear_cache()


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch):
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TEST_TAG, tag)
    helpers.USTACK_PIDS.clear()
    # what in-process runs (pytest's pid) had before: an earlier test's to judge
    before = _tracefs_state({os.getpid()})
    old_children = _children()
    yield
    ours = {os.getpid(), *helpers.USTACK_PIDS}
    # a run of many probes leaves their closing to a detached process
    # (capture/closer.py: the kernel waits ~0.1 s per event): it must finish
    closers_deadline = time.monotonic() + 600
    while _closers(_test_processes(tag, old_children)) and \
            time.monotonic() < closers_deadline:
        time.sleep(0.1)
    # ustack may be in its last milliseconds of cleanup: give it a moment.
    deadline = time.monotonic() + 2
    while True:
        procs = _test_processes(tag, old_children)
        after = _tracefs_state(ours)
        new_events = after["events"] - before["events"]
        new_instances = after["instances"] - before["instances"]
        options_changed = after["trace_options"] != before["trace_options"]
        if not (procs or new_events or new_instances or options_changed) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    # a run's builders may still finish their one object for the next run's
    # cache (src/ustack/objfile/builders.py: by design, nice'd): past the
    # moment above they are ended, as a run's exit leaves them, and reported
    # only if they do not leave
    builders = [pid for pid, cmd in procs.items() if _BUILDER.search(cmd)]
    for pid in builders:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    # (a niced builder on a loaded machine may wait a while for the CPU to
    # run its handler)
    builders_deadline = time.monotonic() + 5
    while builders and time.monotonic() < builders_deadline:
        builders = [pid for pid in builders if _alive(pid)]
        time.sleep(0.05)
    # a process whose memory is gone is exiting (its command line reads
    # empty): the kernel is closing what it held, which can take a grace
    # period per perf event on a loaded machine; judged once it is done
    exiting_deadline = time.monotonic() + 30
    procs = _test_processes(tag, old_children)
    while any(not cmd for cmd in procs.values()) and time.monotonic() < exiting_deadline:
        time.sleep(0.1)
        procs = _test_processes(tag, old_children)
    procs = {pid: cmd for pid, cmd in procs.items()
             if not _BUILDER.search(cmd) or pid in builders}

    problems = []
    if procs:
        problems.append("processes still running: " +
                        "; ".join(f"{pid}: {cmd or _read(Path(f'/proc/{pid}/comm')).strip()}"
                                  for pid, cmd in procs.items()))
        for pid in procs:  # only processes this test started (tagged)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if new_events:
        problems.append(f"probe events left: {sorted(new_events)}")
    if new_instances:
        problems.append(f"tracefs instances left: {sorted(new_instances)}")
    if options_changed:
        added = after["trace_options"] - before["trace_options"]
        problems.append(f"trace_options changed: {sorted(added)}")
        for opt in added:  # each line is "name" or "noname": write back the old one
            old = opt[2:] if opt.startswith("no") else "no" + opt
            try:
                (TRACEFS / "trace_options").write_text(old)
            except OSError:
                pass
    assert not problems, "test left traces behind:\n  " + "\n  ".join(problems)
