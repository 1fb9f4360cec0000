"""Work a run starts before its first sample, for the objects it will
meet: a whole-machine run builds the functions of the big objects of the
processes running now (busy_objects), and those of the middle-sized
objects it names apart (function_builder.build_named_apart), a -p run
those of its process, and with debuginfod servers the
debug files of the run's objects are asked for as they are mapped
(objfile/debuginfod.py). Both run in the background while the capture
opens; nothing here makes the run wait."""
from __future__ import annotations

import os

from . import process


def prepare(target, tracker, symbols) -> None:
    """`target`: the run's Target, `tracker` its MappingTracker, `symbols`
    the SymbolOptions asked for."""
    from ..objfile import function_builder      # imported by every run already (elf.py)
    # set for each run: a -p run in the same process after a whole
    # machine's builds the few objects it names here, as it always did
    function_builder.build_named_apart(target.scope == "system")
    if target.scope == "system":
        from . import busy_objects
        busy_objects.start_building(skip=os.getpid())
    elif target.scope == "pid":
        # node's functions took a cold `-p -d 2` run 6.6 s past its end
        # when first asked for there
        from . import busy_objects
        busy_objects.start_building(skip=os.getpid(), pids=[target.pid])
    if symbols.debuginfod:
        from ..objfile.debuginfod import fetch_for_run
        fetch_for_run(symbols, tracker, process.main_executable(target))
