"""``SegmentedLog.append_stored``: a replica appends its leader's records exactly as the leader
stored them (offsets, timestamps, flags, CRCs), after checking them; a damaged or misplaced copy
writes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tidelog.errors import CorruptRecord, OffsetOutOfRange
from tidelog.log import LogConfig, NewRecord, SegmentedLog
from tidelog.log.config import FlushPolicy


def stored(log: SegmentedLog, start: int = 0, stop: int | None = None) -> list[bytes]:
    """Each record's stored bytes, in offset order."""
    found = []
    for batch in log.forward_reader(start, stop_offset=stop, past_limit=True):
        found += [
            bytes(batch.data[p : p + n])
            for p, n in zip(batch.positions.tolist(), batch.sizes.tolist(), strict=True)
        ]
    return found


def copy(source: SegmentedLog, target: SegmentedLog, start: int, stop: int) -> None:
    records = stored(source, start, stop)
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    target.append_stored(b"".join(records), sizes)


def fill(log: SegmentedLog) -> None:
    log.append([b"plain-%d" % i for i in range(40)])
    log.append(
        [NewRecord(b"v%d" % i, key=b"k%d" % i, headers={"h": b"%d" % i}) for i in range(30)],
        atomic=True,
    )
    log.append([NewRecord(b"x" * 500, key=None)] * 20)
    log.append([b"tail"])


def test_a_copy_in_pieces_holds_the_same_bytes_and_survives_a_reopen(make_log) -> None:
    config = LogConfig(flush_policy=FlushPolicy.NEVER, segment_max_bytes=4096)
    leader = make_log("leader", config)
    fill(leader)
    follower = make_log("follower", config)
    # Pieces that cut the atomic batch and runs of one timestamp in the middle.
    for start, stop in [(0, 9), (10, 54), (55, 55), (56, 90)]:
        copy(leader, follower, start, stop)
    assert follower.next_offset == leader.next_offset == 91
    assert stored(follower) == stored(leader)
    assert follower.segment_count > 1
    follower.close()
    reopened = make_log("follower", config)
    assert stored(reopened) == stored(leader)


def test_a_damaged_copy_writes_nothing(make_log) -> None:
    leader = make_log("leader")
    fill(leader)
    follower = make_log("follower")
    records = stored(leader, 0, 49)
    data = bytearray(b"".join(records))
    data[len(records[0]) * 3 + 40] ^= 0xFF  # a value byte of record 3
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    with pytest.raises(CorruptRecord, match="CRC"):
        follower.append_stored(bytes(data), sizes)
    with pytest.raises(CorruptRecord, match="sizes add up"):
        follower.append_stored(b"".join(records), sizes + 1)
    assert follower.next_offset == 0
    copy(leader, follower, 0, 49)
    assert stored(follower) == stored(leader, 0, 49)


def test_records_must_land_above_the_newest(make_log) -> None:
    leader = make_log("leader")
    fill(leader)
    follower = make_log("follower")
    copy(leader, follower, 0, 20)
    with pytest.raises(OffsetOutOfRange):
        copy(leader, follower, 15, 30)  # overlaps what the follower holds
    assert follower.next_offset == 21
    copy(leader, follower, 21, 90)
    assert stored(follower) == stored(leader)


def test_the_copy_returns_the_records_it_appended_as_checked(make_log) -> None:
    leader = make_log("leader")
    fill(leader)
    follower = make_log("follower")
    records = stored(leader, 30, 80)  # plain, headered (atomic) and keyed records
    sizes = np.array([len(r) for r in records], dtype=np.int64)
    appended = follower.append_stored(b"".join(records), sizes)
    read = list(leader.forward_reader(30, stop_offset=80, past_limit=True))
    assert appended.offsets.tolist() == list(range(30, 81))
    assert appended.offsets.tolist() == [o for b in read for o in b.offsets.tolist()]
    assert appended.timestamps.tolist() == [t for b in read for t in b.timestamps.tolist()]
    assert appended.header_counts().tolist() == [c for b in read for c in b.header_counts()]
    assert [r.headers for r in appended] == [r.headers for b in read for r in b]
    empty = follower.append_stored(b"", np.empty(0, dtype=np.int64))
    assert len(empty.offsets) == 0
    assert follower.next_offset == 81
