"""A full disk on a real filesystem: a small tmpfs the test mounts (root only).

The injected variants in ``test_write_faults.py`` cover the same paths everywhere; this one checks
that the kernel's real answers (ENOSPC on a new page, not on a write into an allocated one) lead
to the same outcome: the log holds exactly the acknowledged appends, before and after a reopen.
"""

from __future__ import annotations

import pytest
from logtools import read_forward
from tests.support.tmpfs import fill_disk, small_tmpfs

from tidelog.errors import DiskFull, ResourceExhausted
from tidelog.log import FlushPolicy, LogConfig, SegmentedLog

VALUE = b"v" * 25  # a 61-byte record: 1,024 of them end the index's fifth page exactly


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
