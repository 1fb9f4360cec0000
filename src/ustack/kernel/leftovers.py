"""The tracing a crashed ustack run left behind (killed with SIGKILL, so
its close() never ran): its ftrace instance and its uprobes, each named
ustack_<pid> after the run's process. The next run removes those whose
process is gone; a live run's (another ustack now) are left alone."""
from __future__ import annotations

import os
import re

from .ftrace_instance import instance_names, remove_instance
from .uprobe_events import GROUP_PREFIX, defined_events, remove_event

_RUN = re.compile(re.escape(GROUP_PREFIX) + r"(\d+)")


def remove_stale_tracing() -> int:
    """Remove the instances, then the uprobes, of ustack runs that no longer
    exist; return how many were removed. Instances first: their enabled
    events hold the probes busy. What the kernel still refuses stays for
    the next run to retry."""
    removed = sum(remove_instance(name) for name in instance_names() if _stale(name))
    for event in defined_events():
        group = event.partition("/")[0]
        if _stale(group):
            try:
                remove_event(event)
                removed += 1
            except OSError:
                pass                    # still in use
    return removed


def _stale(name: str) -> bool:
    """Whether `name` is ustack_<pid> of a process that is gone."""
    m = _RUN.fullmatch(name)
    return m is not None and not os.path.exists(f"/proc/{m.group(1)}")
