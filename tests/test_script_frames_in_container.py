"""Interpreters inside a container (mount and PID namespaces of their own,
a root of their own whose /usr is the host's, bound): `-p` on the host's
pid of each shows its script's frames named, with the script's path as
the container has it (/app, a directory the host does not have), as a
process on the host shows them. The interpreter's files are reached
through the process, not by the path this host gives them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from container import BoundRoot
from helpers import PROGRAMS, ok, run_for_cpu, stop, wait_until

pytestmark = pytest.mark.kernel

# runtime: (its program, the files put in /app (tests/programs/...), its
# argv in the container, how it says it runs: "stdout" (a "ready" line) or
# "file" (it writes /app/ready), its chain outermost first, and the file
# its frames name)
RUNTIMES = {
    "python": ("/usr/bin/python3.11", "python/live.py",
               ["/app/live.py", "short", "600", "/app/ready"], "file",
               ["<module>", "main", "short_main"], "/app/live.py"),
    "ruby": ("/usr/bin/ruby", "ruby/calls.rb", ["/app/calls.rb", "600"], "stdout",
             ["<main>", "Object#a", "block in Object#a", "Object#b", "Worker#c"], "/app/calls.rb"),
    "perl": ("/usr/bin/perl", "perl/calls.pl", ["/app/calls.pl"], "stdout",
             ["<main>", "main::a", "main::b"], "/app/calls.pl"),
    "php": ("/usr/bin/php", "php/chain.php", ["/app/chain.php", "0", "/app/ready"], "file",
            ["{main}", "a", "b", "Spinner::spin"], "/app/chain.php"),
    "node": ("/usr/bin/node", "js/started.js", ["/app/started.js", "600000"], "file",
             ["(anonymous)", "first", "second", "third"], "/app/calls.js"),
    # its classes compiled into /app; leaf() kept a frame of its own
    "java": (shutil.which("java") or "/usr/bin/java", "java/Chain.java",
             ["-XX:CompileCommand=quiet", "-XX:CompileCommand=dontinline,Chain::*",
              "-cp", "/app", "Chain", "600"], "stdout",
             # a Java frame's file is its class's source file, with no directory
             ["Chain.main", "Chain.outer", "Chain.middle", "Chain.leaf"], "Chain.java"),
}


@pytest.fixture
def container(tmp_path):
    return BoundRoot(tmp_path)


def _start(container: BoundRoot, runtime: str) -> tuple:
    program, script, args, ready, _chain, _file = RUNTIMES[runtime]
    # /usr/bin/ruby, php and java are links: the process runs what they name
    program = os.path.realpath(program)
    if not os.path.exists(program):
        pytest.skip(f"{program} is not installed")
    source = PROGRAMS / script
    if source.suffix == ".java":
        subprocess.run([os.path.join(os.path.dirname(program), "javac"), "-d", container.app,
                        source], check=True)
    else:
        for path in source.parent.glob("*"):
            shutil.copy(path, container.app / path.name)
    proc = container.run([program, *args], text=True,
                         stdout=subprocess.PIPE if ready == "stdout" else subprocess.DEVNULL)
    try:
        if ready == "stdout":
            assert proc.stdout.readline() == "ready\n"
        else:
            wait_until((container.app / "ready").exists, 60, f"{runtime} in the container running")
        return proc, container.host_pid(proc, program)
    except BaseException:
        stop(proc)
        raise


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_script_frames_of_a_process_in_a_container(container, runtime, tmp_path):
    proc, pid = _start(container, runtime)
    try:
        out = ok(run_for_cpu(pid, "profile", "-F", "199", "-f", "json", seconds=1.0)).stdout
    finally:
        stop(proc)
    chain, script = RUNTIMES[runtime][4:]
    stacks = [s for s in json.loads(out)["stacks"] if s["pid"] == pid]
    total = sum(s["count"] for s in stacks)
    named = 0
    for s in stacks:
        # the script's frames, outermost first
        mine = [f for f in reversed(s["frames"]) if f.get("file") == script]
        if [f["function"] for f in mine[:len(chain)]] == chain:
            named += s["count"]
    assert total >= 100, out[-2000:]
    # on the host 94-100 % of such samples carry the chain (the rest: a
    # copy read a moment after its sample, disagreeing with it)
    assert named >= 0.85 * total, f"{named} of {total} samples: {out[-3000:]}"
