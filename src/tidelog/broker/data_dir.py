"""The data directory's claim: one broker per directory, and the broker id kept in it.

Invariants. While a broker holds the lock (``flock`` on ``<data_dir>/.lock``, taken without
waiting) no other tidelog server starts on the directory; the lock goes with the descriptor, so
a broker that dies leaves none behind, and ``release`` may be called any number of times. The id
in ``<data_dir>/broker-id`` is the directory's for good: every start reads it back, and only a
missing or empty file gets a new random one.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path

from tidelog.durable import FILE_MODE, replace_file
from tidelog.errors import LogLocked


class DataDirLock:
    """The exclusive lock on one data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        """One broker per data directory (each log also locks its own directory)."""
        fd = os.open(self.data_dir / ".lock", os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogLocked(
                f"data directory {self.data_dir} is in use by another tidelog server; stop it "
                f"or choose another --data-dir"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def stored_broker_id(data_dir: Path) -> str:
    """The broker id kept in ``data_dir``; a new random one is written when there is none."""
    path = data_dir / "broker-id"
    try:
        stored = path.read_text().strip()
    except FileNotFoundError:
        stored = ""
    if not stored:
        stored = secrets.token_hex(8)
        replace_file(path, (stored + "\n").encode(), sync=True)
    return stored
