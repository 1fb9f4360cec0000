"""A report on standard output keeps every byte when its reader is slow
and a signal or a fork comes while ustack waits for it: a write(2) to a
pipe then returns short (a -c command's exit, told by SIGCHLD; a builder
started by another thread), and Python's unbuffered stdout
(PYTHONUNBUFFERED, as containers often set it: a raw file under the text
layer) dropped the rest, 8 KB or more at a time (seen as a trace missing
events in its middle)."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from helpers import ustack_env

CHUNKS, CHUNK = 600, 17_100      # a trace's ~10 MB, in pieces as it writes them

# open_output(None) (standard output) written in a trace's pieces, while
# another thread starts short processes, as a run's builders do
WRITER = textwrap.dedent(f"""
    import subprocess, sys, threading, time
    from ustack.report.output import open_output

    def start_processes():
        for _ in range(400):
            subprocess.Popen(["true"]).wait()
            time.sleep(0.002)

    threading.Thread(target=start_processes, daemon=True).start()
    piece = ("x" * 99 + "\\n") * {CHUNK // 100}
    with open_output(None) as out:
        for _ in range({CHUNKS}):
            out.write(piece)
""")


def test_stdout_to_a_slow_pipe_keeps_every_byte_while_processes_start():
    writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=subprocess.PIPE,
                              env={**ustack_env(), "PYTHONUNBUFFERED": "1"})
    got = 0
    try:
        # a slow reader (the pause is the load, not a wait for anything):
        # the writer finds the pipe full most of the time
        while data := writer.stdout.read1(4096):
            got += len(data)
            time.sleep(0.0005)
        assert writer.wait(timeout=60) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert got == CHUNKS * (CHUNK // 100) * 100
