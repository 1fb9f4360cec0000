"""Writes a run's stream to a recording (recording/format.py) that
recording/reader.py replays later: `ustack record`, `count --record`, and
the test fixtures.

Each mapping carries the build-id of its file, read now (the file may be
rebuilt or gone by the time the recording is read): the reader refuses a
file that is not the recorded one instead of naming frames wrongly. Each
distinct stack is written once (a K record) and events refer to it."""
from __future__ import annotations

import contextlib
import gzip
import os
import re
import struct

from . import format as rf
from ..kernel import procfs
from ..model import (CommEvent, Losses, MmapEvent, Piece, UstackError,
                     python_frame_parts, unwound_sample)
from ..objfile.elf import ElfImage
from ..output import Output
from ..target.mappings import MappingTracker

COMPRESS_LEVEL = 6                 # gzip's default: 9 costs twice the time for ~2% less
MAX_STACKS = 1 << 20               # distinct stacks remembered; then ids start over
MAX_CODES_WRITTEN = 1 << 18        # (pid, code) of Python code records remembered
# the high byte of a Python frame's word (model.PYTHON_FRAME_TAG: 0xE…)
_TAGGED_HIGH_BYTE = re.compile(rb"[\xe0-\xef]")
# of a Java, Ruby, Perl, PHP or JS frame's word (model's *_FRAME_TAG: 0x9… to 0xD…)
_SCRIPT_HIGH_BYTE = re.compile(rb"[\x90-\xdf]")


class RecordWriter:
    """`RecordWriter(path_or_file, labels, modes, backend)`, then
    add_piece() for each piece of the stream, add_counted() for stacks
    counted in the kernel, and close(losses) at the end. `extra`: more
    header fields (the command, its events). A sample with a stack copy
    (DWARF, not unwound) is written whole (an S record); the others as an
    event and its stack, or whole too when `raw`."""

    def __init__(self, path_or_file, labels, modes, backend: str,
                 extra: dict | None = None, raw: bool = False):
        self._target = None               # the Output of a path, see commit()
        if isinstance(path_or_file, Output):      # opened already (before a run)
            self.label = path_or_file.path
            self._target = path_or_file
            fileobj = self._target.file
        elif isinstance(path_or_file, (str, os.PathLike)):
            self.label = os.fspath(path_or_file)
            self._target = Output(path_or_file, what="a recording")
            fileobj = self._target.file
        else:
            self.label = getattr(path_or_file, "name", None) or "the recording"
            fileobj = path_or_file
        name = os.path.basename(self.label) if self._target is not None else ""
        self._out = gzip.GzipFile(filename=name.removesuffix(".gz"), mode="wb",
                                  compresslevel=COMPRESS_LEVEL, fileobj=fileobj)
        self.raw = raw
        self._build_ids: dict = {}        # path opened -> build-id hex or ''
        self._stack_ids: dict = {}        # rf.stack_content -> id
        self._next_id = 0
        self.events = 0                   # samples written, or counted hits
        self.stacks = 0                   # K records written
        try:
            self._write(rf.MAGIC + rf.header_record(labels, modes, backend, extra or {}))
        except BaseException:
            self.discard()
            raise

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, kind, *exc) -> None:
        if self._out is not None:
            if kind is None:
                self.close(Losses())
            else:
                self.discard()

    def add_piece(self, piece: Piece) -> None:
        out = [self._meta(event) for event in piece.metas]
        stack_id, raw = self._stack_id, self.raw
        self.events += len(piece.samples)
        for s in piece.samples:
            if raw or s.regs is not None:      # a stack copy: the sample whole
                out.append(rf.sample_record(s))
            else:
                out.append(rf.event_record(s, stack_id(s, out)))
        self._write(b"".join(out))

    def add_python_codes(self, codes) -> None:
        """(pid, code address, PythonCodeInfo) triples, before the stacks
        that hold them."""
        self._write(b"".join(rf.python_code_record(*c) for c in codes))

    def add_script_frames(self, frames) -> None:
        """(pid, frame word, function, file, line) of interpreter frames,
        before the stacks that hold them."""
        self._write(b"".join(rf.script_frame_record(*f) for f in frames))

    def add_counted(self, counted) -> None:
        """(RawSample, count) pairs: the stacks a kernel map counted."""
        out: list = []
        for sample, n in counted:
            self.events += n
            out.append(rf.counted_record(sample, self._stack_id(sample, out), n))
        self._write(b"".join(out))

    def close(self, losses: Losses = Losses()) -> None:
        """Write the losses (the last record: without it a reader knows the
        file was cut short) and close the file: a file named by its path
        appears now. Any write error is a UstackError naming the file, and
        then nothing is left at the path."""
        try:
            self._write(rf.losses_record(losses))
            try:
                self._out.close()         # the gzip trailer: may meet a full disk
            except OSError as e:
                raise UstackError(f"{self.label}: {e.strerror}") from None
            self._out = None
            if self._target is not None:
                self._target.commit()
                self._target = None
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Stop writing, keeping nothing of a file named by its path."""
        if self._out is not None:
            out, self._out = self._out, None
            out.fileobj = None            # nothing more to write: the file is dropped
            with contextlib.suppress(OSError, ValueError):
                out.close()
        if self._target is not None:
            self._target.discard()
            self._target = None

    def _stack_id(self, sample, out: list) -> int:
        """The id of the sample's stack; its K record goes to `out` first
        when the stack is new."""
        content = rf.stack_content(sample)
        found = self._stack_ids.get(content)
        if found is None:
            if self._next_id >= MAX_STACKS:
                self._stack_ids.clear()   # bounded memory: ids are redefined
                self._next_id = 0
            found = self._stack_ids[content] = self._next_id
            self._next_id += 1
            self.stacks += 1
            out.append(rf.stack_record(found, sample))
        return found

    def _meta(self, event) -> bytes:
        build_id = self._build_id(event) if isinstance(event, MmapEvent) else ""
        return rf.meta_record(event, build_id)

    def _write(self, data: bytes) -> None:
        try:
            self._out.write(data)
        except OSError as e:
            raise UstackError(f"{self.label}: {e.strerror}") from None

    def _build_id(self, event: MmapEvent) -> str:
        m = event.mapping
        if not m.path.startswith("/"):
            return ""
        if m.build_id:                     # the kernel read it from the very file
            return m.build_id
        path = m.host_path or procfs.host_path(event.pid, m.path, m.start, m.end) or m.path
        found = self._build_ids.get(path)
        if found is None:
            try:
                found = ElfImage.open(path).build_id or ""
            except UstackError:
                found = ""                 # gone already, or not ELF: unchecked
            self._build_ids[path] = found
        return found


def recorder_of(session, destination: str | Output) -> "Recorder":
    """The Recorder of a live run asked to record (Options.record), once
    its capture is open; `destination`: the file, opened before the run
    armed anything."""
    opts, plan = session.opts, session.plan
    unwinder = session.resolver.unwinder
    # the kinds whose frame words the run's stacks will carry: those a
    # capture met so far, and Java's where ustack walks JVMs' copied stacks
    # (its table is told so only at the first such stack)
    walks_java = session.opts.java_walked and session.tracker.live
    scripts = {kind: names for kind, names in session.script_names().items()
               if names.active or (kind == "java" and walks_java)}
    return Recorder(
        destination, session.tracker, unwinder, session.labels,
        plan.modes, plan.backend,
        {"command": opts.runs_as, "events": list(opts.events),
         "start_ns": session.started_ns,
         "buffer_pages": session.capture.buffer_pages,
         "stack_storage": opts.stack_storage, "scripts": sorted(scripts)},
        raw_stacks=opts.raw_stacks, python_code=session.python_code, scripts=scripts)


class PendingRecording:
    """A recording's file, opened (output.Output) before the run arms
    anything so that a refusal comes first; begin() makes the run's
    Recorder once its capture is open. Closed or discarded before that,
    nothing of it stays."""

    def __init__(self, path: str):
        self.file = Output(path, what="a recording")

    def begin(self, session) -> "Recorder":
        return recorder_of(session, self.file)

    def close(self, losses: Losses = Losses(), whole: bool = False) -> None:
        self.file.discard()

    discard = close


class Recorder:
    """Saves a live run as it passes (a Session with Options.record): the
    pieces of the stream, and also what the run's mapping tracker learned
    from /proc rather than from the stream (a -p target's mappings, a
    process found running by a system-wide run, thread names), written
    before the samples that needed it, so the recording alone explains
    every stack. DWARF samples are unwound here, where the binaries are
    surely the ones that ran, and saved as their addresses (a few words,
    not 8 KiB of stack); `raw_stacks` keeps the stack copies instead.

    The file is written under a temporary name (output.Output) and
    appears at `path` only when the run ended whole (close(…, whole=True))."""

    def __init__(self, path: str | Output, tracker: MappingTracker, unwinder, labels,
                 modes, backend: str, extra: dict, raw_stacks: bool = False,
                 python_code=None, scripts=None):
        self.path = path.path if isinstance(path, Output) else path
        self.tracker = tracker
        self.unwinder = unwinder
        self.raw_stacks = raw_stacks
        self.writer = RecordWriter(path, labels, modes, backend,
                                   dict(extra, unwound=not raw_stacks), raw=raw_stacks)
        self._written = MappingTracker(live=False)   # what the file says so far
        self._seeds = dict(tracker.last_seed)
        self._checked: set = set()                   # (pid, generation) seen
        self._asked: set = set()                     # tids whose name /proc was asked
        self.python_code = python_code               # names the Python frames' code
        self._codes_written: set = set()             # (pid, code) in the file
        # the names tables of the kinds of interpreter frames the run's
        # kernel pass writes (ruby, php, perl, js) or its walk of a JVM's
        # copied stacks (java), by their words' tag
        scripts = scripts or {}
        self.scripts = {tag: (scripts[kind], parts)
                        for tag, (kind, parts) in rf.SCRIPT_WORDS.items() if kind in scripts}
        self._words_written: set = set()             # (pid, word) in the file
        try:
            self.write_known(set(pid for pid, _gen in tracker.procs))
        except BaseException:
            self.writer.discard()
            raise

    def add_piece(self, piece: Piece) -> Piece:
        """Write a piece (its metadata already applied to the tracker);
        the piece the run goes on with: DWARF samples unwound."""
        samples = piece.samples
        if samples:
            pids = self._explain(samples)
            if not self.raw_stacks and any(s.regs is not None for s in samples):
                samples = self._unwound(samples)
            pids.update(self._seeded())
        else:
            pids = self._seeded()
        for event in piece.metas:
            self._written.apply(event)
        self._add_python_codes(samples)
        self._add_script_frames(samples)
        self.writer.add_piece(Piece(piece.metas + self._learned(pids), samples))
        return Piece(piece.metas, samples) if samples is not piece.samples else piece

    def add_counted(self, counted: list) -> None:
        """Stacks counted in the kernel, (RawSample, count) pairs."""
        pids = self._explain([s for s, _n in counted])
        pids.update(self._seeded())
        self.writer.add_piece(Piece(self._learned(pids), []))
        self._add_python_codes([s for s, _n in counted])
        self._add_script_frames([s for s, _n in counted])
        self.writer.add_counted(counted)

    def _add_python_codes(self, samples) -> None:
        """The names of the code objects the samples' Python frames hold,
        read while their processes live (a report comes after)."""
        if self.python_code is None:
            return
        written, found = self._codes_written, []
        for s in samples:
            chain = s.callchain
            if not _TAGGED_HIGH_BYTE.search(chain[7::8]):   # no Python frame
                continue
            for (word,) in struct.iter_unpack("<Q", chain):
                parts = python_frame_parts(word)
                if parts is None or (s.pid, parts[0]) in written:
                    continue
                if len(written) >= MAX_CODES_WRITTEN:
                    written.clear()            # bounded: a code may be written twice
                written.add((s.pid, parts[0]))
                info = self.python_code.info(s.pid, parts[0])
                if info is not None:
                    found.append((s.pid, parts[0], info))
        if found:
            self.writer.add_python_codes(found)

    def _add_script_frames(self, samples) -> None:
        """The names of the samples' Ruby, PHP, Perl, JS and Java frames,
        read now (from the process or what the kernel copied; a Java
        frame's as ustack's walk of its copied stack read them): per word,
        as a Ruby or JS frame's line depends on its pc, a Java frame's on
        its bci. A frame its table cannot
        name yet is asked again with the next stack holding it; never
        named, a report shows it unnamed, as the run would."""
        if not self.scripts:
            return
        written, new = self._words_written, []
        for s in samples:
            chain = s.callchain
            if not _SCRIPT_HIGH_BYTE.search(chain[7::8]):
                continue
            for (word,) in struct.iter_unpack("<Q", chain):
                if word >> 60 in self.scripts and (s.pid, word) not in written:
                    if len(written) >= MAX_CODES_WRITTEN:
                        written.clear()        # bounded: a word may be written twice
                    written.add((s.pid, word))
                    new.append((s.pid, word))
        if not new:
            return
        for names in {self.scripts[word >> 60][0] for _pid, word in new}:
            if getattr(names, "refresh", None) is not None:
                names.refresh()       # what the kernel saw so far, as a run names it
        found = []
        for pid, word in new:
            names, parts = self.scripts[word >> 60]
            unnamed = names.unnamed
            frame = names.frame(pid, *parts(word))
            if names.unnamed == unnamed:
                # a Java frame's source file is its module (its file only with a line)
                file = frame.file or (frame.module if frame.kind == "java" else "")
                found.append((pid, word, frame.function, file, frame.line))
            else:                      # its names may come later: asked again then,
                names.unnamed = unnamed    # and no frame was shown unnamed
                written.discard((pid, word))
        if found:
            self.writer.add_script_frames(found)

    def write_known(self, pids) -> None:
        """Write what the tracker knows of `pids` that the file does not."""
        self.writer.add_piece(Piece(self._learned(set(pids)), []))

    def close(self, losses: Losses, whole: bool) -> None:
        """Finish the file (whole: the run ended normally) or drop it."""
        if not whole:
            self.writer.discard()
            return
        try:
            self.write_known(self._seeded())   # read from /proc while naming
        except BaseException:
            self.writer.discard()
            raise
        self.writer.close(losses)

    # -- what the stream did not say -------------------------------------------
    def _explain(self, samples) -> set:
        """Make the tracker know each sample's process and thread name now,
        while the process still runs (a live run would read /proc later,
        maybe too late); the pids seeded."""
        tracker, checked, seeded = self.tracker, self._checked, set()
        comms, generations, procs = tracker.comms, tracker.generations, tracker.procs
        for s in samples:
            pid = s.pid
            if s.tid not in comms and pid not in comms and s.tid not in self._asked:
                self._asked.add(s.tid)         # once: a thread gone stays unnamed
                tracker.comm(pid, s.tid)
            key = (pid, generations.get(pid, 0))
            if key not in checked:
                checked.add(key)
                if key not in procs and tracker.live:
                    tracker.seed_from_proc(pid)
                seeded.add(pid)
        return seeded

    def _seeded(self) -> set:
        """Pids the tracker re-read from /proc since the last look."""
        seeds = self.tracker.last_seed
        if seeds == self._seeds:
            return set()
        changed = {pid for pid, t in seeds.items() if self._seeds.get(pid) != t}
        self._seeds = dict(seeds)
        return changed

    def _learned(self, pids: set) -> list:
        """Metadata events for what the tracker knows and the file does not:
        mappings of `pids`, and every thread name."""
        tracker, written, out = self.tracker, self._written, []
        for pid in sorted(pids):
            have = tracker.procs.get((pid, tracker.generations.get(pid, 0)))
            if have is None:
                continue
            told = written.procs.get((pid, written.generations.get(pid, 0)))
            told_maps = {(m.start, m.end, m.pgoff, m.path)
                         for m in (told.maps if told else ())}
            out.extend(MmapEvent(pid, pid, m) for m in have.maps
                       if (m.start, m.end, m.pgoff, m.path) not in told_maps)
        if len(tracker.comms) != len(written.comms):
            out.extend(CommEvent(tid, tid, comm, False)
                       for tid, comm in tracker.comms.items()
                       if written.comms.get(tid) != comm)
        for event in out:
            written.apply(event)
        return out

    def _unwound(self, samples: list) -> list:
        key, find = self.unwinder.stack_key, self.tracker.find
        return [unwound_sample(s, *key(s, find)) if s.regs is not None else s
                for s in samples]
