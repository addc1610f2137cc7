"""A forward reader that reads ahead hands out exactly what one that does not would."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidelog.errors import CorruptRecord
from tidelog.log import LogConfig, SegmentedLog, open_log
from tidelog.log.record import HEADER_SIZE


def _records(log: SegmentedLog, readahead: int, **bounds: int) -> list[tuple[int, bytes]]:
    """Every record read in pieces of at most 300 records and 8 KiB (each piece within them;
    read ahead, each carrying only its own bytes)."""
    reader = log.forward_reader(0, readahead_bytes=readahead, **bounds)
    out: list[tuple[int, bytes]] = []
    while batch := reader.read(300, 8 << 10):
        assert len(batch) <= 300 and (len(batch) == 1 or batch.byte_size <= 8 << 10)
        assert len(batch.data) == batch.byte_size or not readahead
        out += zip(batch.offsets.tolist(), batch.values(), strict=True)
    assert reader.done or "stop_offset" not in bounds
    return out


@pytest.mark.parametrize("bounds", [{}, {"stop_offset": 4321}, {"stop_timestamp": 0}])
def test_readahead_reads_what_a_plain_reader_reads(tmp_path: Path, bounds: dict[str, int]) -> None:
    rng = np.random.default_rng(3)
    log = open_log(tmp_path / "log", LogConfig(segment_max_bytes=1 << 20))
    try:
        for _ in range(20):
            log.append([rng.bytes(int(n)) for n in rng.integers(0, 200, 500)])
        if "stop_timestamp" in bounds:
            stamps = log.forward_reader(0).read(6000, 1 << 30).timestamps
            bounds = {"stop_timestamp": int(stamps[5555])}
        plain = _records(log, 0, **bounds)
        assert _records(log, 1 << 18, **bounds) == plain
        assert len(plain) > 1000
    finally:
        log.close()


def test_readahead_next_offset_and_live_reads(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    try:
        log.append([b"x" * 100] * 1000)
        reader = log.forward_reader(0, readahead_bytes=1 << 20)
        first = reader.read(10, 1 << 20)
        assert first.offsets.tolist() == list(range(10))
        assert reader.next_offset == 10 and not reader.done
        assert reader.wait(0)  # records in hand: nothing to wait for
        rest = reader.read(5000, 1 << 20)
        assert rest.offsets.tolist() == list(range(10, 1000))
        assert not reader.read(10, 1 << 20)
        log.append([b"y"] * 3)
        assert reader.read(10, 1 << 20).values() == [b"y"] * 3
    finally:
        log.close()


def test_readahead_still_refuses_a_damaged_record(tmp_path: Path) -> None:
    log = open_log(tmp_path / "log")
    try:
        log.append([b"v" * 100] * 5000)
        segment = next((tmp_path / "log").glob("*.log"))
        with open(segment, "r+b") as f:  # a value byte of record 3000 (136 bytes each)
            f.seek(3000 * (HEADER_SIZE + 100) + HEADER_SIZE + 7)
            f.write(b"w")
        for readahead in (0, 1 << 20):  # the same records, then the same error, either way
            reader = log.forward_reader(0, readahead_bytes=readahead)
            delivered: list[int] = []
            with pytest.raises(CorruptRecord):
                while batch := reader.read(100, 8 << 10):
                    delivered += batch.offsets.tolist()
            assert delivered == list(range(3000)), readahead
    finally:
        log.close()
