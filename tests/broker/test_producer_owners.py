"""A producer id belongs to the principal that first stored a batch under it (``producers.py``,
"Owners"): another principal's batch is refused before the duplicate check, and the owner
travels with the log (a follower's copy, a rebuild, the snapshot of format 3 or 2)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import pytest

from tidelog.broker.partition import Partition
from tidelog.broker.producers import (
    SNAPSHOT_FILE,
    ProducerIdTaken,
    ProducerTable,
    StoredBatch,
    check_headers,
    with_producer_header,
)
from tidelog.errors import InvalidArgument, PermissionDenied
from tidelog.log import FlushPolicy, LogConfig, NewRecord, SegmentedLog
from tidelog.log.record import encode_batch

CONFIG = LogConfig(flush_policy=FlushPolicy.NEVER, retention_age_s=None)
HIJACK = 1 << 62


def run(tmp_path: Path, scenario) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        partition = Partition("s", 0, tmp_path / "p", CONFIG, asyncio.get_running_loop())
        try:
            await scenario(partition)
        finally:
            partition.close()

    asyncio.run(main())


def test_another_principals_batch_is_refused_and_the_owners_next_batch_stored(
    tmp_path: Path,
) -> None:
    async def scenario(partition: Partition) -> None:
        await partition.publish_idempotent([b"a0"], "p", 0, owner="alice")
        with pytest.raises(ProducerIdTaken, match="belongs to another principal"):
            await partition.publish_idempotent([b"evil"], "p", HIJACK, owner="mallory")
        with pytest.raises(PermissionDenied):  # anonymous is another principal too
            await partition.publish_idempotent([b"evil"], "p", HIJACK)
        assert partition.log.newest_offset == 0, "the refused batch was stored"
        published = await partition.publish_idempotent([b"a1"], "p", 1, owner="alice")
        assert not published.duplicate and published.offsets == range(1, 2)

    run(tmp_path, scenario)


def test_a_refusal_comes_before_the_duplicate_check(tmp_path: Path) -> None:
    """Otherwise a retry of the owner's sequence would tell another principal its offsets."""

    async def scenario(partition: Partition) -> None:
        await partition.publish_idempotent([b"a0"], "p", 0, owner="alice")
        with pytest.raises(ProducerIdTaken):
            await partition.publish_idempotent([b"a0"], "p", 0, owner="mallory")

    run(tmp_path, scenario)


def test_an_unowned_id_is_bound_by_its_next_identified_use(tmp_path: Path) -> None:
    async def scenario(partition: Partition) -> None:
        await partition.publish_idempotent([b"x"], "p", 0)  # anonymous: owned by nobody
        await partition.publish_idempotent([b"x"], "p", 1)
        await partition.publish_idempotent([b"x"], "p", 2, owner="alice")
        with pytest.raises(ProducerIdTaken):
            await partition.publish_idempotent([b"x"], "p", 3, owner="mallory")
        assert partition.producers is not None
        assert partition.producers.get("p") == StoredBatch(2, 2, 1, "alice")

    run(tmp_path, scenario)


def test_owners_survive_a_restart_and_a_rebuild_from_the_log(tmp_path: Path) -> None:
    async def publish(partition: Partition) -> None:
        await partition.publish_idempotent([b"x", b"y"], "p", 0, owner="alice")
        await partition.publish_idempotent([b"z"], "q", 0)

    run(tmp_path, publish)
    snapshot = json.loads((tmp_path / "p" / SNAPSHOT_FILE).read_text())
    assert snapshot["format"] == 3
    assert sorted(snapshot["producers"]) == [["p", 0, 0, 2, "alice"], ["q", 0, 2, 1]]

    async def refused(partition: Partition) -> None:
        with pytest.raises(ProducerIdTaken):
            await partition.publish_idempotent([b"evil"], "p", HIJACK, owner="mallory")

    run(tmp_path, refused)
    (tmp_path / "p" / SNAPSHOT_FILE).unlink()  # the next open rebuilds from the log's headers
    run(tmp_path, refused)


def test_a_format_2_snapshot_is_read_with_its_producers_owned_by_nobody(tmp_path: Path) -> None:
    run(tmp_path, lambda p: p.publish_idempotent([b"x"], "p", 0))
    path = tmp_path / "p" / SNAPSHOT_FILE
    path.write_text(
        json.dumps({"format": 2, "covered": 0, "producers": [["p", 0, 0, 1]], "floor": 1})
    )
    with SegmentedLog(tmp_path / "p", CONFIG) as log:
        table = ProducerTable.restore(log, tmp_path / "p")
    assert table.replayed == 0
    assert table.get("p") == StoredBatch(0, 0, 1, "")


def test_a_followers_copy_carries_the_owner_without_checking_it(tmp_path: Path) -> None:
    items = with_producer_header([b"a", b"b"], "p", 5, "alice")
    batch = encode_batch(items, np.arange(2, dtype=np.int64), time.time_ns(), 1 << 20, atomic=True)

    async def scenario(partition: Partition) -> None:
        await partition.publish_idempotent([b"anon"], "p", 0)  # whatever the follower held
        partition.truncate_to(0)
        partition.append_stored(batch.data.tobytes(), batch.sizes)
        assert partition.producers is not None
        assert partition.producers.get("p") == StoredBatch(5, 0, 2, "alice")
        with pytest.raises(ProducerIdTaken):
            await partition.publish_idempotent([b"evil"], "p", 6, owner="mallory")

    run(tmp_path, scenario)


def test_a_client_cannot_set_the_owner_header_itself() -> None:
    with pytest.raises(InvalidArgument, match="__owner"):
        check_headers([NewRecord(b"x", headers={"__owner": b"alice"})])
