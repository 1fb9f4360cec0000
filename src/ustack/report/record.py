"""Writes a run's stream to a recording (capture/record_format.py) that
capture/recorded.py replays later: `ustack record`, and the test fixtures.

Each mapping carries the build-id of its file, read now (the file may be
rebuilt or gone by the time the recording is read): the reader refuses a
file that is not the recorded one instead of naming frames wrongly."""
from __future__ import annotations

import gzip
from typing import Optional

from ..capture import record_format as rf
from ..kernel import procfs
from ..model import Losses, MmapEvent, Piece, UstackError
from ..objfile.elf import ElfImage

COMPRESS_LEVEL = 6                 # gzip's default: 9 costs twice the time for ~2% less


class RecordWriter:
    """`RecordWriter(path_or_file, labels, modes, backend)`, then
    add_piece() for each piece of the stream and close(losses) at the end.
    `extra`: more header fields (the command line, the date)."""

    def __init__(self, path_or_file, labels, modes, backend: str,
                 extra: Optional[dict] = None):
        try:
            self._out = gzip.open(path_or_file, "wb", compresslevel=COMPRESS_LEVEL)
        except OSError as e:
            raise UstackError(f"{path_or_file}: {e.strerror}") from None
        self._build_ids: dict = {}        # path opened -> build-id hex or ''
        self._write(rf.MAGIC + rf.header_record(labels, modes, backend, extra or {}))

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc) -> None:
        if self._out is not None:
            self.close(Losses())

    def add_piece(self, piece: Piece) -> None:
        out = []
        for event in piece.metas:
            build_id = ""
            if isinstance(event, MmapEvent):
                build_id = self._build_id(event)
            out.append(rf.meta_record(event, build_id))
        out.extend(rf.sample_record(s) for s in piece.samples)
        self._write(b"".join(out))

    def close(self, losses: Losses = Losses()) -> None:
        """Write the losses (the last record: without it a reader knows the
        file was cut short) and close the file."""
        self._write(rf.losses_record(losses))
        self._out.close()
        self._out = None

    def _write(self, data: bytes) -> None:
        try:
            self._out.write(data)
        except OSError as e:
            raise UstackError(f"cannot write the recording: {e.strerror}") from None

    def _build_id(self, event: MmapEvent) -> str:
        m = event.mapping
        if not m.path.startswith("/"):
            return ""
        path = m.host_path or procfs.host_path(event.pid, m.path) or m.path
        found = self._build_ids.get(path)
        if found is None:
            try:
                found = ElfImage.open(path).build_id or ""
            except UstackError:
                found = ""                 # gone already, or not ELF: unchecked
            self._build_ids[path] = found
        return found
