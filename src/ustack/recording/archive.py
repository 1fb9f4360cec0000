"""Copies of the objects a recording's stacks touch (`ustack archive`,
`record --archive`), into a directory made for them.

A recording is a file anyone may have written, and ustack runs as root: a
file is copied only when it proves to be what a mapping of the recorded
process had open (a regular ELF object with executable code, opened
without following a link, whose build-id is the one recorded with the
mapping when one was), and the copy is given no more permission than the
source had. The directory is new (made
here, never one that was there: it could hold planted links)."""
from __future__ import annotations

import contextlib
import os
import stat

from ..model import UstackError
from ..objfile.debuginfo import find_debug_file
from ..objfile.fetched_debug import cached_debug_file
from ..objfile.elf import ElfImage
from ..output import make_directory, open_directory, split, subdirectory

_COPY_MODE = 0o755        # at most; and never more than the source's own


def _image_of_fd(fd: int) -> ElfImage | None:
    try:          # not ElfImage.open: its memo would keep a name that dies with fd
        return ElfImage(f"/proc/self/fd/{fd}")
    except UstackError:
        return None


def open_proven(path: str, build_id: str, follow: bool = False) -> tuple:
    """(fd, stat) of the file at `path` when it is a regular ELF object with
    executable code and, when one was recorded, the build-id `build_id`;
    else (None, why not)."""
    try:
        fd = os.open(os.path.realpath(path) if follow else path,
                     os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        return None, e.strerror
    st = os.fstat(fd)
    image = _image_of_fd(fd) if stat.S_ISREG(st.st_mode) else None
    if image is None or image.file.e_type not in ("ET_EXEC", "ET_DYN") \
            or not image.file.executable_segments():
        why = "not an ELF object with code, as the recorded mapping was"
    elif build_id and image.file.build_id != build_id:
        why = f"build-id {image.file.build_id or 'none'}, recorded {build_id}"
    else:
        return fd, st
    os.close(fd)
    return None, why


class ArchiveWriter:
    """A new directory `directory` (refused when it exists), filled by
    add(); close(keep=False) removes what was written."""

    def __init__(self, directory: str):
        self.directory = directory
        self._fd = make_directory(directory, directory)
        self._subdirs: dict = {}          # relative dir -> fd
        self.written: list = []           # (relative dir, name)
        self.size = 0

    def add(self, source_fd: int, st: os.stat_result, name: str, build_id: str,
            subdir: str = "") -> str | None:
        """Copy the open source into the archive as `name` (NAME.BUILD-ID
        when another object took the name); its path, or None when that
        object is there under both names already."""
        dir_fd = self._dir(subdir)
        if name in ("", ".", ".."):
            name = "object"
        mode = st.st_mode & _COPY_MODE
        for candidate in (name, f"{name}.{build_id or 'no-build-id'}"):
            try:
                out = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                              | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
                break
            except FileExistsError:
                continue
            except OSError as e:
                raise UstackError(f"{self._path(subdir, name)}: {e.strerror}") from None
        else:
            return None
        self.written.append((subdir, candidate))
        where = self._path(subdir, candidate)
        try:
            with os.fdopen(out, "wb") as f:
                os.lseek(source_fd, 0, os.SEEK_SET)
                while True:
                    chunk = os.read(source_fd, 1 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                    self.size += len(chunk)
        except OSError as e:
            raise UstackError(f"{where}: {e.strerror}") from None
        return where

    def _dir(self, subdir: str) -> int:
        if not subdir:
            return self._fd
        fd = self._subdirs.get(subdir)
        if fd is None:
            parent = self._dir(os.path.dirname(subdir))
            fd = self._subdirs[subdir] = subdirectory(
                parent, os.path.basename(subdir), self._path(subdir, ""))
        return fd

    def _path(self, subdir: str, name: str) -> str:
        return os.path.join(self.directory, subdir, name)

    def close(self, keep: bool) -> None:
        if not keep:
            for subdir, name in self.written:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self._dir(subdir))
            for subdir in sorted(self._subdirs, key=len, reverse=True):
                parent = self._dir(os.path.dirname(subdir))
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.basename(subdir), dir_fd=parent)
        for fd in self._subdirs.values():
            os.close(fd)
        self._subdirs.clear()
        os.close(self._fd)
        if not keep:          # through the directory's parent, reached as when made
            parent, name = split(self.directory, self.directory)
            with contextlib.suppress(OSError, UstackError):
                parent_fd = open_directory(parent, self.directory)
                try:
                    os.rmdir(name, dir_fd=parent_fd)
                finally:
                    os.close(parent_fd)


def copy_objects(files: dict, directory: str) -> tuple:
    """Copy `files` ({recorded path: (file here, recorded build-id)}) and
    their separate debug files (in .build-id/xx/…debug, so the directory
    serves as --debug-dir too) into the new `directory`: (paths written,
    bytes, warnings)."""
    warnings: list = []
    archive = ArchiveWriter(directory)
    kept = False
    try:
        for recorded, (source, build_id) in sorted(files.items()):
            fd, st = open_proven(source, build_id)
            if fd is None:
                warnings.append(f"{recorded} not archived: {st}")
                continue
            try:
                archive.add(fd, st, os.path.basename(recorded), build_id)
                # a local debug file, else one fetched from debuginfod
                debug = build_id and (find_debug_file(ElfImage.open(source)).path
                                      or cached_debug_file(build_id))
            finally:
                os.close(fd)
            if debug:
                # found by ustack's own search and proven by its build-id
                dfd, dst = open_proven(debug, build_id, follow=True)
                if dfd is None:
                    warnings.append(f"{debug} not archived: {dst}")
                    continue
                try:
                    archive.add(dfd, dst, build_id[2:] + ".debug", build_id,
                                os.path.join(".build-id", build_id[:2]))
                finally:
                    os.close(dfd)
        kept = True
    finally:
        archive.close(keep=kept)
    return [os.path.join(directory, d, n) for d, n in archive.written], archive.size, warnings
