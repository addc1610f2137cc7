"""Durable files: every write, truncate, reservation and open of the log, the atomic replacement
of every layer's small state files, and the seam for faults.

The bottom of the layers (it imports nothing of tidelog but ``tidelog.errors``): the log writes
its segments and indexes through it; the broker, the cluster and the sites replace their state
files (stream metadata, snapshots, checkpoints, registries) with :func:`replace_json` and
:func:`replace_bytes`, so a test's armed fault reaches those files too.

Rules kept here so no caller has to remember them:
- a write is complete or it raises: short writes are retried from where they stopped, and a write
  that stores nothing is a full disk;
- ENOSPC and EDQUOT become :class:`~tidelog.errors.DiskFull` (whose message says nothing was
  kept: every caller undoes a failed write), except in a sync, where what was written stays
  written: :class:`~tidelog.errors.SyncFailed`; EMFILE and ENFILE become
  :class:`~tidelog.errors.OutOfDescriptors` (all name the path); other ``OSError``\\ s pass
  through unchanged. What the caller must undo after a failure is the caller's business (see
  ``Segment.append``), since only it knows what "before" was;
- a whole file replaced by :func:`replace_file` is either the old one or the new one, and a
  failed replacement leaves no temp file behind;
- everything is private to the server's user: files are created 0600 (:data:`FILE_MODE`) and
  directories made by :func:`make_dirs` 0700 (:data:`DIR_MODE`), whatever the umask (which can
  only take bits away; ``tidelog serve`` also sets it to 077 for the files of RocksDB).

Fault injection. ``faults`` is one module-level :class:`Faults`; a test arms it ("the 3rd write to
a path containing ``.index`` stores 7 bytes, then fails with ENOSPC") and every helper consults it
before the system call. When nothing is armed the cost is one attribute check per call.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tidelog.errors import DiskFull, SyncFailed, resource_error

Buffer = bytes | bytearray | memoryview

WRITE = "write"
TRUNCATE = "truncate"
RESERVE = "reserve"
OPEN = "open"
SYNC = "sync"


@dataclass(slots=True, eq=False)
class Fault:
    """One armed failure: the ``skip + 1``-th matching call fails (``times`` calls in a row)."""

    op: str
    path_contains: str
    skip: int
    keep: int | None
    """For writes: bytes the failing call really stores before failing (a short write)."""
    error: int
    times: int


class Faults:
    """Failures tests arm on purpose; ``armed`` is the only thing the hot path looks at."""

    def __init__(self) -> None:
        self.armed = False
        self._lock = threading.Lock()
        self._rules: list[Fault] = []
        self.hits: list[tuple[str, str]] = []
        """(op, path) of every call that failed on purpose, for tests to check they hit."""

    def fail(
        self,
        path_contains: str = "",
        *,
        op: str = WRITE,
        skip: int = 0,
        keep: int | None = None,
        error: int = errno.ENOSPC,
        times: int = 1,
    ) -> None:
        """Make the ``skip + 1``-th call of ``op`` on a path containing ``path_contains`` fail.

        With ``keep`` (writes only) the failing call stores its first ``keep`` bytes and reports
        a short write; the retry that follows is the one that raises ``error`` (with ``error=0``
        the retry succeeds: a short write that is no failure at all).
        """
        with self._lock:
            self._rules.append(Fault(op, path_contains, skip, keep, error, times))
            self.armed = True

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self.hits.clear()
            self.armed = False

    def _match(self, op: str, path: object) -> Fault | None:
        name = str(path)
        with self._lock:
            for rule in self._rules:
                if rule.op != op or rule.path_contains not in name:
                    continue
                if rule.skip:
                    rule.skip -= 1
                    return None
                if rule.keep is None:
                    rule.times -= 1
                    if not rule.times:
                        self._rules.remove(rule)
                        self.armed = bool(self._rules)
                self.hits.append((op, name))
                return rule
        return None

    def _retire(self, rule: Fault) -> None:
        with self._lock:
            if rule in self._rules:
                self._rules.remove(rule)
            self.armed = bool(self._rules)

    def check(self, op: str, path: object) -> None:
        """Raise the armed failure for ``op`` on ``path``, if there is one."""
        rule = self._match(op, path)
        if rule is not None:
            raise OSError(rule.error, os.strerror(rule.error), str(path))

    def pwrite(self, fd: int, data: memoryview, offset: int, path: object) -> int:
        rule = self._match(WRITE, path)
        if rule is None:
            return os.pwrite(fd, data, offset)
        if rule.keep is not None:
            kept = min(rule.keep, len(data) - 1)
            rule.keep = None  # the retry raises (or, with error 0, succeeds)
            if not rule.error:
                self._retire(rule)
            if kept > 0:
                return os.pwrite(fd, data[:kept], offset)
            if not rule.error:
                return os.pwrite(fd, data, offset)
        raise OSError(rule.error, os.strerror(rule.error), str(path))


faults = Faults()


def _mapped(error: OSError, path: object) -> Exception:
    return resource_error(error, path, undone=True) or error


def pwrite_all(fd: int, data: Buffer, offset: int, *, path: object) -> None:
    """Write all of ``data`` at ``offset`` of ``fd`` (looping over short writes)."""
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    done, total = 0, len(view)
    try:
        while done < total:
            if faults.armed:
                written = faults.pwrite(fd, view[done:], offset + done, path)
            else:
                written = os.pwrite(fd, view[done:] if done else view, offset + done)
            if written <= 0:
                raise DiskFull(str(path), f"a write stored nothing after {done} of {total} bytes")
            done += written
    except OSError as error:
        raise _mapped(error, path) from error


def truncate(fd: int, size: int, *, path: object) -> None:
    """Set the size of ``fd``'s file to ``size``."""
    try:
        if faults.armed:
            faults.check(TRUNCATE, path)
        os.ftruncate(fd, size)
    except OSError as error:
        raise _mapped(error, path) from error


def reserve(fd: int, offset: int, length: int, *, path: object) -> None:
    """Allocate disk blocks for ``[offset, offset + length)`` of ``fd`` now, so later writes into
    that range cannot run out of space. A filesystem that cannot reserve is left to the writes."""
    try:
        if faults.armed:
            faults.check(RESERVE, path)
        os.posix_fallocate(fd, offset, length)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            return
        raise _mapped(error, path) from error


FILE_MODE = 0o600
"""Every file tidelog creates: read and written by the server's user alone."""
DIR_MODE = 0o700
"""Every directory tidelog creates."""


def make_dirs(path: Path) -> None:
    """Create ``path`` and its missing parents, each :data:`DIR_MODE` whatever the umask;
    directories that exist are left as they are."""
    missing: list[Path] = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue
        except OSError as error:
            raise _mapped(error, directory) from error
        os.chmod(directory, DIR_MODE)  # a umask such as 0o277 would have taken owner bits


def make_private(path: Path) -> str | None:
    """Take the group and other bits off the existing directory ``path`` when the server's user
    owns it (chmod needs ownership); ``None`` when it is private now, else why it is not and what
    that exposes, for a warning. A directory tidelog does not own (a Kubernetes volume owned by
    root with an ``fsGroup``, a shared group-writable directory) is the operator's to set up:
    it is left as it is, never a reason to refuse to start. Only the entries directly in it are
    concerned: everything tidelog makes beneath it is 0700 or 0600 already."""
    status = path.stat()
    mode = status.st_mode & 0o7777
    if not mode & 0o077:
        return None
    if status.st_uid == os.geteuid():
        try:
            os.chmod(path, mode & ~0o077)
            return None
        except PermissionError:
            reason = "chmod was refused"
    else:
        reason = f"it belongs to uid {status.st_uid}, not this server's uid {os.geteuid()}"
    exposes = (
        "anyone with write access to it can delete or replace the broker's files in it"
        if mode & 0o022
        else "the names of the files in it can be listed by others, not their contents"
    )
    return f"{path} is mode {mode:o}, not private ({reason}): {exposes}"


def open_fd(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``os.open`` with out-of-space and out-of-descriptors failures mapped."""
    try:
        if faults.armed:
            faults.check(OPEN, path)
        return os.open(path, flags, mode)
    except OSError as error:
        raise _mapped(error, path) from error


def sync_fd(fd: int, call: Callable[[int], None], *, path: object) -> None:
    """``call(fd)``: ``os.fdatasync`` (the data and the size) or ``os.fsync`` (all metadata).

    A full disk here is :class:`~tidelog.errors.SyncFailed`: the bytes were written already. On
    Linux a failed fsync may also drop the dirty pages it could not write (a retry can then
    succeed without writing them); recovery after a restart is what checks such data.
    """
    try:
        if faults.armed:
            faults.check(SYNC, path)
        call(fd)
    except OSError as error:
        found = resource_error(error, path)
        if isinstance(found, DiskFull):
            raise SyncFailed(found.resource, found.path, found.reason) from error
        raise (found or error) from error


def replace_file(path: Path, data: Buffer, *, sync: bool) -> None:
    """Replace ``path`` with ``data`` atomically (a temp file renamed over it).

    ``sync``: fsync the temp file before the rename, so the new content is durable once it is
    visible. On failure the temp file is removed and ``path`` is untouched.
    """
    tmp = path.with_name(path.name + ".tmp")
    write_new_file(tmp, data, sync=sync)
    try:
        os.replace(tmp, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _mapped(error, path) from error


def write_new_file(path: Path, data: Buffer, *, sync: bool) -> None:
    """Create (or overwrite) ``path`` holding exactly ``data``; removed again if that fails."""
    fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        pwrite_all(fd, data, 0, path=path)
        if sync:
            sync_fd(fd, os.fsync, path=path)
    except BaseException as error:
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
        if isinstance(error, SyncFailed):  # the file is gone again: a write undone
            raise DiskFull(error.path, f"{error.reason}; nothing of the write was kept") from error
        raise
    os.close(fd)


def replace_json(path: Path, data: Any, **dump: Any) -> None:
    """Replace ``path`` with ``data`` as JSON atomically and durably (:func:`replace_file` with
    ``sync=True``). A crash leaves either the old file or the new one, never a torn one; a failure
    (a full disk: ``DiskFull``) leaves the old file and no temp file. ``dump``: options for
    ``json.dumps`` (e.g. ``indent``)."""
    replace_file(path, json.dumps(data, **dump).encode(), sync=True)


def replace_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably, as :func:`replace_json` does (for
    binary snapshots such as the sites' tag index)."""
    replace_file(path, data, sync=True)
