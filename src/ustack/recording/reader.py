"""A recording (recording/format.py) as a capture: the same Stream and Session
machinery replays it with no kernel, no root and no target.

Mapped files are looked up where they are now: first in `objects`
(directories holding copies of the recorded binaries, matched by build-id,
then by name), then at their recorded path. A file whose build-id is not
the recorded one (rebuilt, another distribution's libc) is refused: its
frames stay unnamed and `warnings` says why, once per file."""
from __future__ import annotations

import gzip
import os
import struct
import zlib

from ..model import Losses, UstackError
from ..objfile.elf import ElfImage
from . import format as rf
from ..capture.contract import Capture

READ_SIZE = 1 << 20                # decompressed bytes read per chunk
_METAS = (rf.MMAP, rf.COMM, rf.FORK, rf.EXIT)
# Where a refused file's mapping points instead: never an ELF file, so the
# symbolizer and the unwinder read nothing from it (unnamed frames).
REFUSED = os.devnull


class RecordedCapture(Capture):
    """`RecordedCapture(path, objects=())`; open() reads the header:
    `labels`, `modes` (per probe: fp | dwarf) and `backend` of the run."""
    counts_in_kernel = True             # counted(): what the recorded run counted there
    python_code = None      # the session's PythonCode: given the recorded code objects
    # the session's names tables by kind (ruby, php, perl, js: symbols/):
    # given the recorded interpreter frames' names
    script_names: dict = {}

    def __init__(self, path: str, objects=()):
        self.path = path
        self.objects = tuple(objects)
        self.header: dict = {}
        self.labels: tuple = ()
        self.modes: tuple = ()
        self.backend = ""
        self.warnings: list = []           # files refused or missing, one sentence each
        self._file = None
        self._pending = b""                # the start of a record not yet read whole
        self._ended = False                # the LOSSES record was seen
        self._losses = Losses()
        self._located: dict = {}           # (path, build-id) -> host path
        # (recorded path, host path) -> the build-id recorded with it: what
        # proves a file to be the one a mapping had open (recording/archive.py)
        self.recorded_build_ids: dict = {}
        self._by_build_id: dict | None = None   # build-id -> file in objects
        self._by_name: dict = {}           # basename -> file in objects
        self._stacks: dict = {}            # K records: stack id -> sample template
        self._counted: list = []           # N records: (RawSample, count)

    @property
    def unwind_note(self) -> str:
        return f"recorded with backend {self.backend}"

    def _fail(self, why: str) -> UstackError:
        return UstackError(f"{self.path}: {why}")

    # -- the capture interface ---------------------------------------------------
    def open(self) -> None:
        try:
            self._file = gzip.open(self.path, "rb")
            magic = self._file.read(len(rf.MAGIC))
            head = self._file.read(rf.RECORD.size)
        except FileNotFoundError:
            raise self._fail("no such recording") from None
        except (OSError, EOFError, zlib.error) as e:
            raise self._fail(f"not a ustack recording ({e})") from None
        if magic != rf.MAGIC or len(head) < rf.RECORD.size:
            raise self._fail("not a ustack recording")
        size, kind = rf.RECORD.unpack(head)
        try:
            payload = self._file.read(size)
            if kind != rf.HEADER or len(payload) != size:
                raise ValueError("no header")
            header = rf.parse_json(payload)
            version = header["version"]
            if version > rf.VERSION:
                raise self._fail(f"recording format version {version} is newer "
                                 f"than this ustack reads ({rf.VERSION})")
            self.labels = tuple(header["labels"])
            self.modes = tuple(header["modes"])
            self.backend = header["backend"]
        except UstackError:
            raise
        except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as e:
            raise self._fail(f"corrupt recording header ({e})") from None
        self.header = header
        for kind in header.get("scripts", ()):
            names = self.script_names.get(kind)
            if names is not None:      # its stacks carry that kind's frame words
                names.active = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def losses(self) -> Losses:
        return self._losses

    def counted(self, reset: bool = False) -> list:
        """(RawSample, count) of the stacks the recorded run counted in the
        kernel (its samples came as metadata only), once the stream is read."""
        return self._counted

    def read_chunks(self, timeout_ms: int) -> list:
        """The next whole records of the file, as one chunk ([] at the end).
        A damaged or cut file ends with a FAILURE record: decode raises it
        on the caller's thread (this may run on the drain thread)."""
        if self._file is None:
            return []
        try:
            data = self._file.read(READ_SIZE)
        except (OSError, EOFError, zlib.error) as e:
            return self._end([rf.failure(f"{self.path}: corrupt or truncated "
                                         f"recording ({e})")])
        if not data:
            if self._pending or not self._ended:
                return self._end([rf.failure(
                    f"{self.path}: truncated recording (it ends before the "
                    "run's last record)")])
            return self._end([])
        data = self._pending + data
        whole, failure = self._whole_records(data)
        self._pending = data[whole:]
        if failure:
            return self._end([data[:whole] + rf.failure(f"{self.path}: {failure}")])
        return [data[:whole]] if whole else self.read_chunks(timeout_ms)

    def _end(self, chunks: list) -> list:
        self.close()
        return chunks

    def _whole_records(self, data: bytes) -> tuple:
        """(length of the whole records at the start of data, why the file
        is corrupt or '')."""
        at, n = 0, len(data)
        while at + rf.RECORD.size <= n:
            size, kind = rf.RECORD.unpack_from(data, at)
            if kind not in rf.KINDS or self._ended:
                return at, "corrupt recording (a record of unknown kind)"
            end = at + rf.RECORD.size + size
            if end > n:
                break
            self._ended = kind == rf.LOSSES
            at = end
        return at, ""

    def decode(self, chunk, metas: list, samples: list, start: int = 0,
               budget: int = 1 << 62) -> int:
        """Records from `start` for about `budget` bytes into metas (as
        (0, event): the file's order is the stream's) and samples; stops
        before metadata that follows a sample, so each piece's metadata
        explains its samples and no earlier ones. Returns the offset reached."""
        at, n = start, len(chunk)
        stop_at = min(n, start + budget)
        unpack, head, event, stacks = rf.RECORD.unpack_from, rf.RECORD.size, rf.EVENT, self._stacks
        while at < stop_at:
            size, kind = unpack(chunk, at)
            body = at + head
            if kind == event:                  # the common record, read in place
                try:
                    samples.append(rf.parse_event(chunk, body, size, stacks))
                except KeyError as e:
                    raise self._fail(f"corrupt recording (an event of stack {e}, "
                                     "never defined)") from None
                except (ValueError, struct.error) as e:
                    raise self._fail(f"corrupt recording ({e})") from None
                at = body + size
                continue
            payload = memoryview(chunk)[body:body + size]
            if kind == rf.FAILURE:
                rf.raise_failure(payload)
            if kind in _METAS and samples:
                return at                  # the next piece starts here
            try:
                if kind == rf.STACK:
                    stack_id, template = rf.parse_stack(payload)
                    self._stacks[stack_id] = template
                elif kind == rf.COUNTED:
                    self._counted.append(rf.parse_counted(payload, self._stacks))
                elif kind == rf.SAMPLE:
                    samples.append(rf.parse_sample(payload))
                elif kind == rf.MMAP:
                    metas.append((0, self._located_event(*rf.parse_mmap(payload))))
                elif kind == rf.LOSSES:
                    self._losses = rf.parse_losses(payload)
                elif kind == rf.PYCODE:
                    pid, code, info = rf.parse_python_code(payload)
                    if self.python_code is not None:
                        self.python_code.add(pid, code, info)
                elif kind == rf.SCRIPT:
                    self._script_frame(*rf.parse_script_frame(payload))
                else:
                    metas.append((0, rf.parse_meta(kind, payload, self.header["version"])))
            except (ValueError, KeyError, TypeError, IndexError) as e:
                raise self._fail(f"corrupt recording ({e or type(e).__name__})") from None
            except struct.error as e:
                raise self._fail(f"corrupt recording ({e})") from None
            at = body + size
        return at

    def _script_frame(self, pid: int, word: int, function: str, file: str,
                      line: int) -> None:
        kind, parts = rf.SCRIPT_WORDS.get(word >> 60, (None, None))
        if kind is None:
            raise ValueError(f"an interpreter frame record of word {word:#x}")
        names = self.script_names.get(kind)
        if names is not None:              # else a reader that names no frames
            names.recorded(pid, parts(word), function, file, line)

    # -- where the recorded files are now -------------------------------------------
    def _located_event(self, event, build_id: str):
        m = event.mapping
        if not m.path.startswith("/"):
            return event                   # [vdso], [anon:…]: no file to find
        key = (m.path, build_id)
        host = self._located.get(key)
        if host is None:
            host = self._located[key] = self._locate(m.path, build_id)
            self.recorded_build_ids[(m.path, host)] = build_id
        if host == m.path:
            return event
        return type(event)(event.pid, event.tid,
                           type(m)(m.start, m.end, m.pgoff, m.path, host))

    def _locate(self, path: str, build_id: str) -> str:
        """The file to open for a recorded mapping of `path`, or REFUSED."""
        by_build_id = self._objects_by_build_id()
        if build_id in by_build_id:
            return by_build_id[build_id]
        name = os.path.basename(path)
        candidates = [self._by_name[name]] if name in self._by_name else []
        candidates.append(path)
        for candidate in candidates:
            found = _build_id(candidate)
            if found is None and not os.path.exists(candidate):
                continue
            if not build_id or found == build_id:
                return candidate
            which = (f"{path} here is not the recorded file" if candidate == path
                     else f"{candidate} is not the file recorded as {path}")
            self.warnings.append(
                f"{which} (build-id {found or 'none'}, recorded {build_id}): "
                "rebuilt or another version; its frames stay unnamed")
            return REFUSED
        self.warnings.append(f"{path} (build-id {build_id or 'unknown'}) is not "
                             "here: its frames stay unnamed (give the directory "
                             "holding a copy as an objects directory)")
        return REFUSED

    def _objects_by_build_id(self) -> dict:
        """Every ELF file in the objects directories by build-id (read once)."""
        if self._by_build_id is None:
            self._by_build_id = {}
            for directory in self.objects:
                try:
                    entries = sorted(os.scandir(directory), key=lambda e: e.name)
                except OSError as e:
                    self.warnings.append(f"objects directory {directory}: {e.strerror}")
                    continue
                for entry in entries:
                    if not entry.is_file():
                        continue
                    self._by_name.setdefault(entry.name, entry.path)
                    found = _build_id(entry.path)
                    if found:
                        self._by_build_id.setdefault(found, entry.path)
        return self._by_build_id


def _build_id(path: str) -> str | None:
    try:
        return ElfImage.open(path).build_id
    except UstackError:
        return None
