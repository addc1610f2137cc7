"""A full disk on a real filesystem: a small tmpfs the test mounts (root only).

The injected variants in ``test_write_faults.py`` cover the same paths everywhere; this one checks
that the kernel's real answers (ENOSPC on a new page, not on a write into an allocated one) lead
to the same outcome: the log holds exactly the acknowledged appends, before and after a reopen.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from logtools import read_forward

from tidelog.errors import DiskFull, ResourceExhausted
from tidelog.log import FlushPolicy, LogConfig, SegmentedLog

VALUE = b"v" * 25  # a 61-byte record: 1,024 of them end the index's fifth page exactly


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; test_write_faults.py injects the same failures")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(directory: Path) -> Path:
    """Write a file until the filesystem refuses more; return it (delete it to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(chunk)
    return filler


def config() -> LogConfig:
    return LogConfig(flush_policy=FlushPolicy.NEVER, index_preallocate_bytes=1 << 20)


@pytest.mark.parametrize("first", [1024, 1000, 1100])
def test_a_full_disk_refuses_appends_and_loses_nothing_acked(tmp_path, first):
    with small_tmpfs(tmp_path / "mnt", "2m") as mnt:
        acked: list[tuple[int, bytes]] = []
        log = SegmentedLog(mnt / "log", config())
        try:
            for offset in log.append([VALUE] * first):
                acked.append((offset, VALUE))
            filler = fill_disk(mnt)
            refused = None
            for n in range(200):  # single records, until one needs a page the disk lacks
                value = b"%025d" % n
                try:
                    offsets = log.append([value])
                except (OSError, ResourceExhausted) as error:
                    refused = error
                    break
                acked.append((offsets[0], value))
            filler.unlink()
            for n in range(5):
                value = b"after-%019d" % n
                offsets = log.append([value])
                acked.append((offsets[0], value))
            assert [(r.offset, r.value) for r in read_forward(log)] == acked
            assert [o for o, _ in acked] == list(range(len(acked)))
            assert log.verify() == len(acked)
            assert refused is not None, "the disk never filled up"
            assert isinstance(refused, DiskFull), refused
        finally:
            log.close()
        reopened = SegmentedLog(mnt / "log", config())
        try:
            assert reopened.recovery_report.clean
            assert [(r.offset, r.value) for r in read_forward(reopened)] == acked
        finally:
            reopened.close()
