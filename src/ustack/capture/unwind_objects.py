"""Objects' unwind rows in the in-kernel unwinder's maps (bpf_unwind.py's
ROWS, PAGES, OBJECTS): loaded once per (dev, inode) whichever processes
map the object, placed in free ranges of the table (row_space.py), the
table grown by a chunk (row_chunks.py) when none holds them, up to the
run's bound, and at the bound
evicted for another object when the table is short of room: those no
walk met lately lose their entries, and their rows are reused only after
an RCU grace period (kernel/grace_period.py), so a walk never reads rows
being rewritten."""
from __future__ import annotations

import os
import struct
import time
from array import array
from collections.abc import Callable

from ..kernel import grace_period
from ..kernel import procfs
from ..kernel.proc_root import backing_devices
from ..model import Mapping
from ..objfile.elf import ElfImage
from ..objfile.mapped import object_path
from ..objfile.vdso import vdso_file
from ..unwind import tables
from .bpf_common import unwind_object
from .fork_safe_lock import ForkSafeLock
from .row_space import RowSpace

_OBJ = unwind_object()
ROW_SIZE = tables.ROW.size       # struct unwind_row
OBJ_KEY = _OBJ.layout("object_key").struct
# first row, rows, vaddr - file offset; page index: first slot, first page,
# pages; the runtimes' slots; libjvm; the tick a walk last met it at
OBJ_VALUE = _OBJ.layout("object_rows").struct
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
VDSO_KEY = (0, 1)                # OBJECTS' key of the vDSO (it has no file): VDSO_INODE
TABLE_FULL_MARK = 0x7FFFFFFF     # an object's first row when its rows did not fit
# EPOCH (unwind.h), the clock of object_rows.touched: one tick each
# EPOCH_S at most, from the loader's thread (lazy_rows.py). A tick, not
# time read: a loader held up (a loaded machine) stops the clock, so an
# object met meanwhile never looks idle for it.
EPOCH_S = 0.25
# an object not met by a walk for this many ticks (0.75 s or more) may
# lose its rows to one that does not fit: only under pressure, and an
# evicted object's next samples are copies (unwound in user space: whole)
# until its rows are back (from the cache: milliseconds), so a run whose
# working set moves (processes coming and going) recovers within seconds
IDLE_EPOCHS = 4
RETRY_FULL_S = 0.5               # how often the loader retries sampled full objects


def kernel_dev(st_dev: int) -> int:
    """A stat() st_dev in the kernel's own encoding (MAJOR << 20 | MINOR),
    as inode->i_sb->s_dev holds it."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


TableSource = Callable[..., object]   # (ElfImage, run_waits=) -> PackedRows (data, len), or None


class UnwindObjects:
    """Loads objects' rows into the maps, once per (dev, inode): a library
    shared by many processes is loaded once. `tables(image)` builds the
    rows (unwind/tables.for_image); `bytes_loaded` reports the table
    memory. An object whose rows do not fit is entered with no rows and
    TABLE_FULL_MARK, so the stacks through it end saying so.
    `interpreters` (bpf_python.PythonProcs, when the run merges Python
    frames) gives an interpreter object's slot of Python facts, which its
    OBJECTS entry points at (object_rows.python); `v8` (bpf_v8.V8Objects,
    when the run names JS frames) a V8 object's slot of its layout
    (object_rows.v8); `php` (bpf_php.PhpObjects, when the run merges PHP
    frames) a PHP interpreter's slot (object_rows.php); `perl`
    (bpf_perl.PerlObjects, when the run merges Perl frames) a Perl object's
    slot of its facts (object_rows.perl); `ruby` (bpf_ruby.RubyObjects, when
    the run merges Ruby frames) a Ruby VM object's slot (object_rows.ruby).
    `passes` (runtime_passes.RuntimePasses, when the programs reach the
    runtimes' passes by tail calls) loads a runtime's pass before the entry
    of an object of it is written: no walk meets the runtime before.

    Rows and page-index slots come from free ranges (row_space.RowSpace).
    When an object's rows do not fit, the table grows by chunks
    (row_chunks.RowChunks.grow) while it is within its bound; at the
    bound, objects no walk met for IDLE_EPOCHS
    ticks (object_rows.touched, tick) are evicted (_victims) until they do:
    their OBJECTS entries deleted and forgotten in
    `loaded` (a later walk wants them again: lazy_rows.py reloads them),
    then an RCU grace period (kernel/grace_period.py) before their rows are
    given to another object: a walk reads an entry's rows inside one run of
    its program. No grace period to be had: no eviction. An object entered
    full whose entry a walk stamped lately is loaded again by retry_full
    once room can be made. `evicted`, `reloaded` (evicted, then loaded
    again) and `recovered` (full, then loaded) count them for the closing
    note (churn_note); growth_note tells how the table grew during the run."""

    def __init__(self, maps, tables: TableSource):
        self.maps = maps
        self.tables = tables
        self._rows_free = None          # RowSpace of ROWS, of PAGES: made at first load
        self.rows_at_start = None       # ROWS' rows when the run started (started())
        self._pages_free = None
        self.loaded: dict = {}          # (dev, ino) -> (path, rows)
        # the objects whose rows do not fit now: (dev, ino) -> (path, keys, rows)
        self._full_keys: dict = {}
        self._placed: dict = {}         # (dev, ino) -> _Placed: rows held in the table
        self._evicted_keys: set = set()
        self.evicted = self.reloaded = self.recovered = 0
        self._retried_at = 0.0
        self.epoch = 0                  # EPOCH's value: 0 till the first tick
        self._met_in_copies: dict = {}  # (dev, ino) -> the tick a deferred stack met it at
        self._keys_of: dict = {}        # host path -> its OBJECTS key (met_in_copy)
        self._ticked_at = 0.0
        # set by a run whose evicted objects come back (its stacks deferred
        # meanwhile, a loader reading WANTED): off, an evicted object's
        # stacks would be cut
        self.may_evict = False
        self.interpreters = None
        self.v8 = None
        self.php = None
        self.perl = None
        self.ruby = None
        self.passes = None
        # the run's reader and the lazy loader (lazy_rows.py) both load;
        # closed: the maps are gone, nothing more is written
        self._lock = ForkSafeLock()
        self.closed = False

    def add_vdso(self) -> None:
        """Load the rows of this kernel's vDSO (ustack's copy of it)."""
        path = vdso_file()
        if path is not None:
            self.add_path(path, VDSO_KEY)

    def add_path(self, path: str, key: tuple | None = None, *, run_waits: bool = True,
                 cached_only: bool = False) -> bool:
        """Load the rows of the object at `path` (a host path), if new;
        `key`: its OBJECTS key, else its (dev, inode); run_waits=False:
        the run goes on without them (tables' `run_waits`). cached_only:
        only rows the cache holds; False when they would have to be built
        (nothing is loaded: lazy_rows.py builds them after the start)."""
        keys = [key] if key is not None else object_keys(path)
        if not keys or keys[0] in self.loaded:
            return True
        return self._build_and_load(path, keys, run_waits, cached_only)

    def _build_and_load(self, path: str, keys: list, run_waits: bool = False,
                        cached_only: bool = False, again: bool = False) -> bool:
        """add_path's work; `again`: an object entered full, tried anew."""
        python = self.interpreters.slot_of(path) if self.interpreters is not None else 0
        v8 = self.v8.slot_of(path) if self.v8 is not None else 0
        php = self.php.slot_of(path) if self.php is not None else 0
        perl = self.perl.slot_of(path) if self.perl is not None else 0
        ruby = self.ruby.slot_of(path) if self.ruby is not None else 0
        if self.passes is not None:     # verified while the rows are built
            self.passes.after(_runtimes(python, v8, php, perl, ruby))
        try:
            image = ElfImage.open(path)
            packed = (self.tables(image, run_waits=run_waits, cached_only=True)
                      if cached_only else self.tables(image, run_waits=run_waits))
            if packed is tables.NOT_CACHED:
                return False
            segs = image.executable_segments()
        except Exception:                # unreadable: the stack says "no CFI"
            packed, segs = None, []
        with self._lock:
            if not self.closed and (keys[0] not in self.loaded
                                    or again and keys[0] in self._full_keys):
                self._load(path, keys, packed, segs, python, v8, php, perl, ruby)
        return True

    def _load(self, path: str, keys: list, packed, segs: list, python: int = 0,
              v8: int = 0, php: int = 0, perl: int = 0, ruby: int = 0) -> None:
        first, n, adjust, page_slot, first_page, npages = 0, 0, 0, 0, 0, 0
        key = keys[0]
        if packed is not None and segs:
            vaddr, offset, _size = segs[0]
            adjust = vaddr - offset
            n = len(packed)
            got = self._place(n, key)
            if got is None:
                first, wanted_rows, n = TABLE_FULL_MARK, n, 0    # unwound from copies
                self._full_keys[key] = (path, keys, wanted_rows)
            else:
                first = got
                self._write_rows(first, packed.data, n)
                pages = packed.pages()
                slot = self._pages_space().take(len(pages) // 4)
                if slot is not None and pages:
                    page_slot, first_page = slot, packed.first_page
                    npages = len(pages) // 4
                    self.maps.pages.update_batch(
                        array("I", range(page_slot, page_slot + npages)).tobytes(), pages)
                # else: whole-object searches. An object of a runtime keeps
                # its rows (the passes may write its entry later), the vDSO
                # too (no path brings it back)
                self._placed[key] = _Placed(
                    keys, path, first, n, page_slot, npages, self.epoch,
                    key != VDSO_KEY and not _runtimes(python, v8, php, perl, ruby))
                if self._full_keys.pop(key, None) is not None:
                    self.recovered += 1
                if key in self._evicted_keys:
                    self._evicted_keys.discard(key)
                    self.reloaded += 1
        self.loaded[key] = (path, n)
        entry = OBJ_VALUE.pack(first, n, adjust, page_slot, first_page, npages, python, v8,
                               php, perl, ruby, int(is_jvm_object(path)), 0)
        runtimes = _runtimes(python, v8, php, perl, ruby)
        # the entry makes walks go on in its runtimes' passes: written once
        # they are loaded (till then its stacks are deferred)
        if not (self.passes is not None and runtimes
                and self.passes.after(runtimes, lambda: self._enter(keys, entry))):
            self._enter(keys, entry, locked=True)

    def _rows_space(self) -> RowSpace:
        if self._rows_free is None:
            self._rows_free = RowSpace(self.maps.rows.rows)
        return self._rows_free

    def started(self) -> None:
        """The run's first objects are loaded: growth from now on is
        growth_note's."""
        self.rows_at_start = self.maps.rows.rows

    def _grow_for(self, n: int) -> bool:
        """Chunks added to the table until `n` rows fit in one free range
        (the lock held); False when the bound comes first: the room made
        stays, so eviction makes the rest (fewer objects evicted)."""
        space = self._rows_space()
        while not space.fits(n):
            added = self.maps.rows.grow()
            if not added:
                return False
            space.grow(added)
        return True

    def _pages_space(self) -> RowSpace:
        if self._pages_free is None:
            self._pages_free = RowSpace(self.maps.pages.max_entries)
        return self._pages_free

    def _growable(self, n: int) -> bool:
        """Whether growing the table to its bound makes room for `n` rows
        (the free rows at its end and the chunks still to make)."""
        space = self._rows_space()
        return n - space.tail <= self.maps.rows.bound - space.capacity

    def _place(self, n: int, key: tuple) -> int | None:
        """The first row of `n` rows for the object `key` (the lock held),
        idle objects evicted to make room; None: no room."""
        space = self._rows_space()
        first = space.take(n)
        if first is not None or n > self.maps.rows.bound:
            return first
        if self._grow_for(n):
            return space.take(n)
        victims = self._victims(n, key)
        if not victims:
            return None
        gone = []
        for victim in victims:          # no walk finds them from now on
            placed = self._placed.pop(victim)
            gone.append(placed)
            for k in placed.keys:
                self.maps.objects.delete(OBJ_KEY.pack(*k))
            del self.loaded[victim]
            self._evicted_keys.add(victim)
            self.evicted += 1
        # a walk that read one of their entries before the deletes reads
        # its rows until its program's run ends: after a grace period none
        # does. Without one (refused now) their rows are never reused.
        if not grace_period.wait():
            return None
        for placed in gone:
            space.give_back(placed.first, placed.rows)
            self._pages_space().give_back(placed.page_slot, placed.pages)
        return space.take(n)

    def _victims(self, n: int, key: tuple, stamps: dict | None = None) -> list:
        """The objects to evict so that `n` rows fit (the lock held), of
        those no walk met for IDLE_EPOCHS: one whose rows alone make room
        if any (never met first, then the longest idle), else never met
        ones and the longest idle until they do; [] when evicting all of
        them would not make room, or no grace period can be waited for
        (their rows could not be reused). `stamps`: (dev, ino) -> its
        object_rows.touched, read already.

        One object alone where it can: a walk stops at the first object
        without rows, so while one's rows are missing the objects beneath
        it in the same stacks (libc, the executable) are not stamped, and
        look idle beside it."""
        if not self.may_evict or not grace_period.available():
            return []
        now = self.epoch
        idle = []
        for k, placed in self._placed.items():
            if k == key or not placed.evictable:
                continue
            touched = max(stamps[k] if stamps is not None else self._touched(k),
                          self._met_in_copies.get(k, 0))
            last = max(touched, placed.since)
            if now - last >= IDLE_EPOCHS:
                idle.append((touched != 0, last, k))
        idle.sort()
        space = self._rows_space()
        for _met, _last, k in idle:
            placed = self._placed[k]
            if space.run_if_given_back(placed.first, placed.rows) >= n:
                return [k]
        trial = space.copy()           # grown to the bound first, as _place does
        trial.grow(self.maps.rows.bound - trial.capacity)
        chosen = []
        for _met, _last, k in idle:
            placed = self._placed[k]
            trial.give_back(placed.first, placed.rows)
            chosen.append(k)
            if trial.fits(n):
                return chosen
        return []

    def tick(self) -> None:
        """EPOCH one tick on, if EPOCH_S passed since the last (from the
        loader's thread, every few tens of ms)."""
        if time.monotonic() - self._ticked_at < EPOCH_S:
            return
        with self._lock:
            if not self.closed:
                self._ticked_at = time.monotonic()
                self.epoch += 1
                self.maps.epoch.update(_U32.pack(0), _U32.pack(self.epoch))

    @property
    def full(self) -> list:
        """Paths of the objects whose rows do not fit now, first found first."""
        return [path for path, _keys, _rows in self._full_keys.values()]

    @property
    def short_of_room(self) -> bool:
        """Whether objects' rows are out of the table for want of room:
        their stacks deferred, what they met beneath them not stamped."""
        return bool(self._full_keys or self.evicted)

    def met_in_copy(self, paths) -> None:
        """The objects at host `paths` were met by a stack unwound in user
        space (a walk stopped above them): stamped as met now, in user
        space, for eviction's choice (_victims)."""
        for path in paths:
            key = self._keys_of.get(path)
            if key is None:
                keys = object_keys(path)
                key = self._keys_of[path] = keys[0] if keys else ()
            if key:
                self._met_in_copies[key] = self.epoch

    def _touched(self, key: tuple) -> int:
        """The tick a walk last met the object `key` at (0: never, or gone)."""
        raw = self.maps.objects.lookup(OBJ_KEY.pack(*key))
        return OBJ_VALUE.unpack(raw)[-1] if raw is not None else 0

    def retry_full(self, force: bool = False) -> int:
        """Load again the objects entered full that a walk met lately, where
        room can be made for them now (evicting idle ones); at most every
        RETRY_FULL_S unless `force`. Returns how many were loaded. Called
        by the loader's thread (lazy_rows.py)."""
        if not self._full_keys or not force and (
                time.monotonic() - self._retried_at < RETRY_FULL_S):
            return 0
        self._retried_at = time.monotonic()
        with self._lock:
            if self.closed:
                return 0
            todo = []
            stamps = None               # read once, where a full object is sampled
            for k, (path, keys, rows) in self._full_keys.items():
                touched = self._touched(k)
                if not touched or self.epoch - touched >= IDLE_EPOCHS:
                    continue
                if stamps is None:
                    stamps = {p: self._touched(p) for p in self._placed}
                if (self._rows_space().fits(rows) or self._growable(rows)
                        or self._victims(rows, k, stamps)):
                    todo.append((path, keys))
        done = 0
        for path, keys in todo:
            self._build_and_load(path, keys, again=True)
            done += keys[0] in self._placed
        return done

    def churn_note(self) -> str:
        """What the closing note says of rows evicted and loaded again, else ""."""
        if not (self.evicted or self.recovered):
            return ""
        size = _mib(self.maps.rows.bound * ROW_SIZE)
        said = (f"the in-kernel unwind table ({size} MiB) evicted the rows of "
                f"{_objects(self.evicted, 'idle object')} to make room, {self.reloaded} of "
                "them loaded again as they were sampled")
        if self.recovered:
            was = "was" if self.recovered == 1 else "were"
            said += (f"; {_objects(self.recovered, 'object')} whose rows had not fit {was} "
                     "loaded later (their stacks meanwhile unwound from copies)")
        return said[0].upper() + said[1:]

    def growth_note(self) -> str:
        """What the closing note says of the table grown during the run
        (after started()), else ""."""
        table = self.maps.rows
        if self.rows_at_start is None or table.rows <= self.rows_at_start:
            return ""
        return (f"The in-kernel unwind table grew from {_mib(self.rows_at_start * ROW_SIZE)} "
                f"to {_mib(table.rows * ROW_SIZE)} MiB of rows during the run (at most "
                f"{_mib(table.bound * ROW_SIZE)} MiB), for objects loaded meanwhile")

    def _enter(self, keys: list, entry: bytes, locked: bool = False) -> None:
        """The object's OBJECTS entry under each of its keys (`locked`: the
        caller holds the lock)."""
        if not locked:
            with self._lock:
                if not self.closed:
                    self._enter(keys, entry, locked=True)
            return
        for k in keys:
            self.maps.objects.update(OBJ_KEY.pack(*k), entry)

    def wanted(self) -> dict:
        """(dev, inode) -> walks that met the object without rows (WANTED),
        of the objects not loaded yet; those loaded leave the map."""
        out = {}
        with self._lock:
            if self.closed:
                return out
            for k, v in self.maps.wanted.items():
                key = OBJ_KEY.unpack(k)
                if key in self.loaded:
                    self.maps.wanted.delete(k)
                else:
                    out[key] = _U64.unpack(v)[0]
        return out

    def close(self) -> None:
        """No more loads: the maps are about to close."""
        with self._lock:
            self.closed = True

    def _write_rows(self, first: int, data: bytes, n: int) -> None:
        self.maps.rows.write_values(first * ROW_SIZE, data[:n * ROW_SIZE])

    @property
    def table_bytes(self) -> int:
        """Bytes the table's chunks take now (the kernel memory made; the
        last chunk may reach past the bound)."""
        return self.maps.rows.made_bytes

    def add_jvm(self, pid: int) -> None:
        """pid runs a JVM: its walks through JIT code are deferred, its
        Java frames walked in user space (unwind.h's through_jvm_jit)."""
        with self._lock:
            if not self.closed:
                self.maps.jvms.update(_U32.pack(pid), b"\x01")

    def note_mapping(self, mapping, pid: int) -> None:
        """What an MMAP2 record tells of its process: a JVM's when it maps
        libjvm."""
        if is_jvm_object(mapping.path):
            self.add_jvm(pid)

    def add_mapping(self, mapping, pid: int, cached_only: bool = False) -> bool:
        """Load the object of a mapping an MMAP2 record announced (as
        add_path: False when cached_only and its rows must be built)."""
        if mapping.path.startswith("/") and not mapping.host_path:
            mapping = Mapping(mapping.start, mapping.end, mapping.pgoff, mapping.path,
                              procfs.host_path(pid, mapping.path, mapping.start,
                                               mapping.end))
        path = object_path(mapping)
        return path is None or self.add_path(path, cached_only=cached_only)

    @property
    def rows_used(self) -> int:
        """Rows of the table held by loaded objects now."""
        return self._rows_free.used if self._rows_free is not None else 0

    @property
    def bytes_loaded(self) -> int:
        return self.rows_used * ROW_SIZE

    def full_note(self, from_copies: bool = True, named: list = ()) -> str:
        """What the run says when objects' rows do not fit the table now,
        else "": their stacks were unwound in user space, from copies, where
        the programs defer them (`from_copies`), else cut there with a note.
        `named`: the objects a note named already; those found full since
        (mapped during the run: the ones the user is asking about now) are
        named first."""
        full = self.full
        if not full:
            return ""
        order = [p for p in full if p not in named] + [p for p in full if p in named]
        names = ", ".join(os.path.basename(p) for p in order[:3])
        more = f" and {len(full) - 3} more" if len(full) > 3 else ""
        size = self.maps.rows.bound * ROW_SIZE
        what = "1 object's" if len(full) == 1 else f"{len(full)} objects'"
        then = ("their stacks unwound from copies in user space" if from_copies
                else "their stacks cut there")
        v8 = [os.path.basename(p) for p in full
              if self.v8 is not None and p in self.v8.slot_paths]
        if v8:          # unwind.h's find_mapping: V8's code keeps frame pointers
            then += (f" ({', '.join(dict.fromkeys(v8))}: walked on its frame pointers "
                     "in the kernel, JS frames named)")
        return (f"{what} unwind rows did not fit the in-kernel "
                f"table ({_mib(size)} MiB: {names}{more}), {then}; "
                f"--unwind-memory MIB makes it bigger")


class _Placed:
    """An object's rows in the table: its OBJECTS keys, path, first row and
    rows, page-index slot and pages, the tick they were loaded at
    (`since`), whether they may be evicted."""
    __slots__ = ("keys", "path", "first", "rows", "page_slot", "pages", "since", "evictable")

    def __init__(self, keys, path, first, rows, page_slot, pages, since, evictable):
        self.keys, self.path, self.first, self.rows = keys, path, first, rows
        self.page_slot, self.pages, self.since, self.evictable = page_slot, pages, since, evictable


def _runtimes(python: int, v8: int, php: int, perl: int, ruby: int) -> list:
    """The runtimes (runtime_passes.PASS_PROGRAMS' names) of an object
    given its slots in their passes' objects maps (0: none)."""
    return [runtime for runtime, slot in (("python", python), ("v8", v8), ("php", php),
                                          ("perl", perl), ("ruby", ruby)) if slot]


# HotSpot's object (unwind/hotspot_runtime.LIBJVM, not imported: ~3 ms of
# every run's start)
LIBJVM = "libjvm.so"


def is_jvm_object(path: str) -> bool:
    """Whether the object at `path` is a JVM's libjvm (HotSpot)."""
    return os.path.basename(path) == LIBJVM


def _objects(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.3g}"


def object_keys(path: str) -> list:
    """The OBJECTS keys of the object at `path` (a host path): its (dev,
    inode), then those of the layers beneath a container's overlayfs (the
    kernel's vma holds the backing file: its device, the same inode);
    [] when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [(kernel_dev(st.st_dev), st.st_ino),
            *((kernel_dev(d), st.st_ino) for d in backing_devices(st.st_dev))]
