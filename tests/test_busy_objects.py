"""A whole-machine run starts building the functions of the big objects
that running processes have mapped before their first sample arrives."""
import os
import shutil
import signal
import subprocess

import pytest

from ustack.objfile import builder_child, function_builder
from ustack.objfile.elf import ElfImage
from ustack.target import busy_objects

SPIN = 'console.log("ready"); for (;;) {}'


@pytest.fixture
def node():
    path = shutil.which("node")
    if path is None:
        pytest.skip("node is not installed")
    return os.path.realpath(path)


# a cache of each test's own, its builders stopped after it (conftest.py)
pytestmark = pytest.mark.usefixtures("own_object_cache")


def started(*argv) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_the_objects_of_a_running_process_not_a_stopped_one(node, tmp_path):
    stopped_node = tmp_path / "node"
    shutil.copy(node, stopped_node)
    busy, stopped = started(node, "-e", SPIN), started(str(stopped_node), "-e", SPIN)
    os.kill(stopped.pid, signal.SIGSTOP)
    os.waitpid(stopped.pid, os.WUNTRACED)      # every thread of it stopped
    try:
        found = busy_objects.mapped_by_running(skip=os.getpid())
    finally:
        busy.kill()
        stopped.kill()
    assert node in found
    assert str(stopped_node) not in found


def test_their_functions_are_built_by_a_child_before_they_are_asked(node, tmp_path):
    images = tmp_path / "cache" / "images"
    busy = started(node, "-e", SPIN)
    try:
        # node's objects alone: on a machine running bigger ones (a
        # compiler's libLLVM), node is not among the biggest few built
        busy_objects.start_building(skip=os.getpid(), pids=[busy.pid]).join()
    finally:
        busy.kill()
    function_builder.wait(node)         # the child, started by the thread
    assert images.is_dir() and any(images.iterdir())
    image = ElfImage.open(node)
    parsed = ElfImage.parsed_files
    assert image.find("main")            # read from what the child wrote ...
    assert ElfImage.parsed_files == parsed   # ... not parsed here


def test_a_builder_started_ahead_yields_the_cpu_until_the_run_waits_for_it(node):
    """Nothing waits for a head start's builder: it runs nicer than the
    run (the machine's work first) until the run asks for the names and
    waits, from then at the run's own niceness."""
    import threading

    from helpers import wait_until
    from ustack.objfile import cache as objcache
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    # held as another run's builder of node would: the child waits its turn
    # and cannot end while this test looks at it
    other_run = objcache.hold(builder_child.lock_name(("functions", node)))
    busy = started(node, "-e", SPIN)
    try:
        busy_objects.start_building(skip=os.getpid(), pids=[busy.pid]).join()
        child = function_builder.start(ElfImage.open(node))    # the one running
        assert child is not None and child.poll() is None
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == \
            mine + function_builder.NOTHING_WAITS_NICENESS
        run = threading.Thread(target=function_builder.wait, args=(node,))
        run.start()
        wait_until(lambda: os.getpriority(os.PRIO_PROCESS, child.pid) == mine,
                   timeout=10, what="the waited-for builder at the run's niceness")
    finally:
        os.close(other_run)
        busy.kill()
        busy.wait()
    run.join(timeout=60)
    assert child.wait(timeout=60) == 0


def _builders_of(path: str) -> list:
    """The pids of the builder processes this test's runs started for the
    object at `path` (a whole-machine run of another user of this machine
    may build it too: its processes lack this test's tag)."""
    tag = f"USTACK_TEST_TAG={os.environ['USTACK_TEST_TAG']}".encode()
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/environ", "rb") as f:
                ours = tag in f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if ours and b"ustack.objfile.function_child" in argv and path.encode() in argv:
            found.append(int(entry))
    return found


def test_a_head_start_for_an_object_the_run_never_met_ends_with_the_run(node, tmp_path):
    """A -p run on a node that makes no syscall: its functions' builder,
    started ahead of their first use, is stopped as the run ends, not left
    building an object no event met."""
    from helpers import run_ustack
    copy = tmp_path / "node"              # its builder is this test's alone
    shutil.copy(node, copy)
    busy = started(str(copy), "-e", SPIN)
    try:
        res = run_ustack("trace", "syscall:sync", "-p", busy.pid, "-d", "0.5", timeout=120)
        left = _builders_of(str(copy))
    finally:
        busy.kill()
        busy.wait()
    assert res.returncode == 0, res.stderr
    assert left == [], res.stderr
