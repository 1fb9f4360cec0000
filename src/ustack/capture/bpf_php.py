"""PHP frames in the in-kernel walk: what user space does for
src/ustack/bpf/php.h.

The kernel merges a thread's PHP frames into its native stack when the
walk went through a PHP interpreter object (the php CLI, php-fpm,
libphp) whose rows point at its facts in PHP_OBJECTS: the executor's
globals, execute_ex's range, the version's offsets
(unwind/php_runtime.py). This module fills that map as the run's
objects load (unwind_objects.UnwindObjects asks `slot_of` of each): a -c
command's load closure before it runs, what -p and whole-machine
processes map, the objects the walk wants later. Nothing is done per
process.

The kernel names a PHP frame's function by an id and copies what the id
names (function, class, file, first line) into PHP_NAMES at the sample;
they are taken out into the run's PhpFunctions (symbols/php.py) every
HARVEST_EVERY seconds while a PHP object is followed, and once more before
the maps close: so a function is named after its process is gone."""
from __future__ import annotations

import struct

from ..unwind import php_runtime
from .bpf_common import unwind_object
from .interpreter_objects import InterpreterMaps, InterpreterObjects

OBJECTS = 16                    # PHP interpreter objects
FUNCTIONS = 1 << 15             # (tgid, function) -> id, an LRU
NAMES = 1 << 12                 # ids whose names user space has not taken yet (~1.2 MB)
HARVEST_EVERY = 0.1             # seconds between two takes of PHP_NAMES
_NAME_KEY = struct.Struct("<IIQ")       # struct php_name_key


class PhpMaps(InterpreterMaps):
    """php.h's maps, shared by the run's unwinder programs; `lock` is held
    by whoever writes them, and by close(), which first takes the names
    left (`before_close`)."""

    def __init__(self, objects: int = OBJECTS, functions: int = FUNCTIONS, names: int = NAMES):
        super().__init__((("php_objects", objects), ("php_functions", functions),
                          ("php_names", names), ("php_scratch", None)))


def pack_object(interp: php_runtime.Interpreter) -> bytes:
    """PHP_OBJECTS' value (struct php_object) of an interpreter."""
    layout = unwind_object().layout("php_object")
    out = bytearray(layout.struct.size)
    at = layout.offsets
    for name, v in interp.layout:
        struct.pack_into("<I", out, at[name], v)
    major, minor = interp.version
    struct.pack_into("<I", out, at["version"], major << 8 | minor)
    struct.pack_into("<Q", out, at["executor_globals"], interp.executor_globals)
    struct.pack_into("<QQ", out, at["execute_start"], *interp.execute_range)
    return bytes(out)


class PhpObjects(InterpreterObjects):
    """The run's PHP interpreter objects, in PHP_OBJECTS, and the names of
    the functions the kernel gave ids, taken into `functions` (the run's
    PhpFunctions, symbols/php.py, or None). `objects`: the run's
    unwind_objects.UnwindObjects, which asks `slot_of` of each object it loads."""

    objects_map = "php_objects"
    detect = staticmethod(php_runtime.object_interpreter)
    pack = staticmethod(pack_object)
    harvest_every = HARVEST_EVERY
    harvester_name = "ustack-php-names"

    def __init__(self, maps: PhpMaps, functions=None, objects=None):
        super().__init__(maps)
        self.functions = functions
        self.interpreters = self.slot_paths     # PHP_OBJECTS' slots: their paths
        maps.before_close = self.harvest
        if objects is not None:
            objects.php = self

    def wants_harvest(self) -> bool:
        return True         # the names are taken even with no one to name them

    def harvest(self) -> int:
        """Take the names the kernel copied since last time; how many."""
        with self.maps.lock:
            if not self.maps.all:
                return 0
            try:
                taken = self.maps.php_names.items(take=True)
            except OSError:
                return 0
        if self.functions is not None:
            for key, value in taken:
                tgid, _pad, function_id = _NAME_KEY.unpack(key)
                self.functions.remember(tgid, function_id, value)
        return len(taken)
