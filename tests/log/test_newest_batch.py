"""The newest batch served from memory (``log/newest.py``): a read that would return exactly the
batch just written gets the writer's own bytes, record for record what the file gives, and any
other read, or any read after the log's end moved otherwise, goes through the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tidelog.errors import CorruptRecord
from tidelog.log import FlushPolicy, LogConfig, NewRecord, open_log
from tidelog.log.batch import MessageBatch
from tidelog.log.newest import NEWEST_MAX_BYTES
from tidelog.log.record import HEADER_SIZE
from tidelog.log.segmented import SegmentedLog

BATCHES = {
    "plain": [b"v%03d" % i for i in range(10)],
    "one-size": [b"x" * 100] * 50,
    "mixed": [b"", b"a", b"bb" * 300, b"c"],
    "keys-and-headers": [
        NewRecord(b"v1", key=b"k1", headers={"h": b"1"}),
        NewRecord(b"v2"),
        NewRecord(b"v3", key=b"", headers={"a": b"", "b": b"22"}),
    ],
}


def served(log: SegmentedLog) -> MessageBatch | None:
    newest = log._writer.newest
    return None if newest is None else newest.batch()


def same(a: MessageBatch, b: MessageBatch) -> None:
    assert a.data == b.data
    for name in ("positions", "sizes", "offsets", "timestamps"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name
        assert getattr(a, name).dtype == getattr(b, name).dtype, name
    assert a.records() == b.records()
    assert a._header is not None and b._header is not None
    assert a._header.tobytes() == b._header.tobytes()


@pytest.mark.parametrize("name", sorted(BATCHES))
@pytest.mark.parametrize("atomic", [False, True])
def test_what_memory_serves_is_what_the_file_gives(tmp_path: Path, name: str, atomic: bool) -> None:
    directory = tmp_path / "log"
    with open_log(directory) as log:
        log.append([b"before"] * 3)
        log.append(BATCHES[name], atomic=atomic)
        from_memory, hw, _ = log.read_forward(3, 2**62, 1000, 1 << 20)
        assert from_memory is served(log)  # the writer's batch, not a read of the file
    with open_log(directory) as reopened:  # nothing in memory: through the file
        assert served(reopened) is None
        from_file, hw_again, _ = reopened.read_forward(3, 2**62, 1000, 1 << 20)
    assert hw == hw_again
    same(from_memory, from_file)


def test_a_live_reader_reads_each_new_batch_from_memory(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        reader = log.forward_reader(0, readahead_bytes=1 << 20)
        for k in range(5):
            log.append([b"%d-%d" % (k, i) for i in range(10)])
            newest = served(log)
            batch = reader.read(1000, 1 << 20)
            assert batch is newest
            assert batch.offsets.tolist() == list(range(10 * k, 10 * k + 10))
            assert not reader.read(1000, 1 << 20)


def test_reads_it_would_not_answer_whole_go_through_the_file(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.append([b"a"] * 5)
        log.append([b"b"] * 10)
        newest = served(log)
        for start, limit, max_messages, max_bytes in (
            (4, 2**62, 1000, 1 << 20),  # starts before it
            (6, 2**62, 1000, 1 << 20),  # starts inside it
            (5, 13, 1000, 1 << 20),  # stops inside it
            (5, 2**62, 9, 1 << 20),  # too many records
            (5, 2**62, 1000, 10 * (HEADER_SIZE + 1) - 1),  # too many bytes
        ):
            batch, _, _ = log.read_forward(start, limit, max_messages, max_bytes)
            assert batch is not newest and batch


def test_the_commit_limit_holds_it_back(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.set_commit_limit(-1)
        log.append([b"m"] * 3)
        assert not log.read_forward(0, 2**62, 1000, 1 << 20)[0]
        copied, _, _ = log.read_forward(0, 2**62, 1000, 1 << 20, past_limit=True)
        assert copied is served(log)  # a replica's copy may take it
        log.set_commit_limit(1)
        shown, _, _ = log.read_forward(0, 2**62, 1000, 1 << 20)
        assert shown.offsets.tolist() == [0, 1]


def test_always_flush_serves_it_once_synced(tmp_path: Path) -> None:
    with open_log(tmp_path / "log", LogConfig(flush_policy=FlushPolicy.ALWAYS)) as log:
        log.append([b"m"] * 3)
        assert log.read_forward(0, 2**62, 1000, 1 << 20)[0] is served(log)


def test_a_roll_a_truncation_or_stored_records_make_it_stale(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.append([b"a"] * 4)
        log.roll()  # the batch is in a sealed segment now
        batch, _, _ = log.read_forward(0, 2**62, 1000, 1 << 20)
        assert batch.offsets.tolist() == [0, 1, 2, 3] and batch is not served(log)

        log.append([b"b"] * 4)
        log.truncate_to(6)
        assert served(log) is None
        assert log.read_forward(4, 2**62, 1000, 1 << 20)[0].values() == [b"b", b"b"]

        log.append([b"c"] * 2)
        stored, _, _ = log.read_forward(6, 2**62, 1000, 1 << 20)
        assert stored is served(log)
        with open_log(tmp_path / "other") as other:  # records as another log stored them
            other.append_at([b"d"] * 2, [8, 9])
            copy, _, _ = other.read_forward(8, 2**62, 1000, 1 << 20)
        log.append_stored(copy.data, copy.sizes)
        assert served(log) is None
        assert log.read_forward(8, 2**62, 1000, 1 << 20)[0].values() == [b"d", b"d"]


def test_a_batch_over_the_cap_is_not_kept(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.append([b"z" * 1000] * (NEWEST_MAX_BYTES // 1000 + 1))
        assert served(log) is None


def test_damage_under_it_is_found_by_the_next_read_through_the_file(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.append([b"v" * 100] * 10)
        segment = next((tmp_path / "log").glob("*.log"))
        with open(segment, "r+b") as f:
            f.seek(HEADER_SIZE + 7)
            f.write(b"w")
        live, _, _ = log.read_forward(0, 2**62, 1000, 1 << 20)
        assert live.values() == [b"v" * 100] * 10  # the bytes written, never the damage
        with pytest.raises(CorruptRecord):
            log.verify()
        with pytest.raises(CorruptRecord):
            log.read_forward(0, 2**62, 5, 1 << 20)


def test_shared_arrays_are_what_a_file_read_would_make(tmp_path: Path) -> None:
    with open_log(tmp_path / "log") as log:
        log.append([b"q"] * 3)
        batch = served(log)
        assert batch is not None
        assert batch.positions.dtype == np.int64 and batch.sizes.dtype == np.int64
        assert batch.positions.tolist() == [0, HEADER_SIZE + 1, 2 * (HEADER_SIZE + 1)]
