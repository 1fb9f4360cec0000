"""A whole-machine `ustack profile` (its JSON) with a program started
once ustack says it samples: the program's own stacks. Shared by the
interpreter benchmarks (a process started during a run)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def stacks_of_program_started_during(argv: list, hz: int = 199) -> list:
    """The JSON stacks (dicts: pid, count, frames) of `argv`'s process,
    started once the whole-machine run samples, ended when it exits."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "all.json"
        us = subprocess.Popen([sys.executable, "-m", "ustack", "profile", "-F", str(hz),
                               "-f", "json", "-o", str(out)], stderr=subprocess.PIPE,
                              text=True, cwd=REPO,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
        try:
            for line in us.stderr:
                if line.startswith("Tracing") or "Hit Ctrl-C" in line or "Sampling" in line:
                    break
            prog = subprocess.Popen([str(a) for a in argv], stdout=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL)
            prog.wait()
            us.send_signal(signal.SIGINT)
            us.communicate(timeout=120)
        finally:
            if us.poll() is None:
                us.kill()
                us.wait()
        data = json.loads(out.read_text())
    return [s for s in data["stacks"] if s.get("pid") == prog.pid]
