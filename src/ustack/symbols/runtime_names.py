"""The run's names tables of interpreters' and JITs' frames, one per
runtime (PythonCode, V8Functions, PhpFunctions, PerlSubs, RubyIseqs,
JavaMethods), each made, and its module imported, at its first use: when
the capture first meets an object of the runtime, or a stack first
carries a frame of it. A run that meets none, a one-hit trace of `echo`,
imports none of them. `made(kind)` answers without making."""
from __future__ import annotations

import importlib
import threading

# kind -> (module in symbols/, class, whether it takes `live`)
TABLES = {"python": ("python", "PythonCode", True), "js": ("v8", "V8Functions", True),
          "php": ("php", "PhpFunctions", False), "perl": ("perl", "PerlSubs", False),
          "ruby": ("ruby", "RubyIseqs", True), "java": ("hotspot", "JavaMethods", False)}


class RuntimeNames:
    """`live`: the pids are this host's processes as they run (False for a
    recording's), given to the tables that read processes."""

    def __init__(self, live: bool = True, **given):
        self.live = live
        self._made: dict = dict(given)     # kind -> its table
        # the rows loader's thread and the run's; reentrant: a signal handler
        # run while this thread makes a table waits for nothing
        self._lock = threading.RLock()

    def get(self, kind: str):
        """The table of `kind` ("python", "js", "php", "perl", "ruby", "java"),
        made now if it is not yet."""
        table = self._made.get(kind)
        if table is None:
            with self._lock:
                table = self._made.get(kind)
                if table is None:
                    module, name, takes_live = TABLES[kind]
                    made = getattr(importlib.import_module(f".{module}", __package__), name)
                    table = self._made[kind] = made(self.live) if takes_live else made()
        return table

    def close(self) -> None:
        """The run is over: the tables that read processes let go of them."""
        for table in list(self._made.values()):
            close = getattr(table, "close", None)
            if close is not None:
                close()

    def made(self, kind: str):
        """The table of `kind` if it is made, else None."""
        return self._made.get(kind)

    def active(self, kind: str):
        """The table of `kind` if it is made and a capture told it its
        frames come (`active`), else None."""
        table = self._made.get(kind)
        return table if table is not None and table.active else None

    @property
    def python_code(self):
        return self.get("python")

    @property
    def v8_functions(self):
        return self.get("js")

    @property
    def php_functions(self):
        return self.get("php")

    @property
    def perl_subs(self):
        return self.get("perl")

    @property
    def ruby_iseqs(self):
        return self.get("ruby")
