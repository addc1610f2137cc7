"""Stream lifecycle under races and faults: a delete and a create of the same name never touch
each other's files, a failed create leaves nothing behind, and internal streams are written,
paused and made read-only by the broker alone."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest
from tests.broker.brokertools import broker_config, running

from tidelog.broker import Broker, StreamConfig, ViewKind, ViewSpec
from tidelog.errors import (
    DiskFull,
    InvalidArgument,
    OutOfDescriptors,
    PermissionDenied,
    StreamDeleting,
    StreamExists,
    StreamNotFound,
)
from tidelog.wire import CURSORS_STREAM


async def _create_when_free(broker: Broker, name: str, config: StreamConfig) -> int:
    """Create ``name`` as a client would: retry until the old stream of that name is gone.
    Returns how many attempts were refused first."""
    refused = 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            broker.create_stream(name, config)
            return refused
        except (StreamExists, StreamDeleting):
            refused += 1
            # Tight retries first (to hit every step of the delete), then give its thread room.
            await asyncio.sleep(0 if refused < 1_000 else 0.001)
    raise AssertionError(f"the deleted stream's name never became free ({refused} refusals)")


@pytest.mark.parametrize("round_", range(6))
def test_delete_racing_create_of_the_same_name_keeps_the_new_stream(
    tmp_path: Path, round_: int
) -> None:
    config = broker_config(tmp_path)
    wide = StreamConfig(partitions=32)

    async def race() -> None:
        async with running(config) as broker:
            broker.create_stream("s", wide)
            for number in range(32):
                await broker.publish("s", number, [b"old-%d" % i for i in range(50)])
            deleting = asyncio.create_task(broker.delete_stream("s"))
            # Let the delete get as far as round_ loop steps before the create starts retrying.
            for _ in range(round_):
                await asyncio.sleep(0)
            await _create_when_free(broker, "s", wide)
            offsets = (await broker.publish("s", 7, [b"new-%d" % i for i in range(200)])).offsets
            assert list(offsets) == list(range(200))
            await deleting

    async def check() -> None:
        async with running(config) as broker:
            log = broker.partition("s", 7).log
            assert log.high_watermark == 199
            values = [v for batch in log.forward_reader(0) for v in batch.values()]
            assert values == [b"new-%d" % i for i in range(200)]
            assert all(
                broker.partition("s", n).log.high_watermark == -1 for n in range(32) if n != 7
            )

    asyncio.run(race())
    asyncio.run(check())
    # Nothing of the deleted stream is left on disk once the broker has closed.
    assert not any((tmp_path / "deleted").iterdir()) if (tmp_path / "deleted").exists() else True


def test_a_create_waits_for_a_delete_in_progress_instead_of_failing(tmp_path: Path) -> None:
    async def race() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=8))
            deleting = asyncio.create_task(broker.delete_stream("s"))
            await asyncio.sleep(0)
            await broker.wait_deleted("s")
            broker.create_stream("s")
            await deleting
            assert broker.stream("s").partition(0).log.high_watermark == -1

    asyncio.run(race())


def test_a_delete_interrupted_by_a_crash_is_finished_at_start(tmp_path: Path) -> None:
    """A tombstone (a deleted stream's directory, renamed) is removed when the broker starts,
    and a stream directory without its metadata (a create that crashed) is never loaded."""
    config = broker_config(tmp_path)
    tombstone = tmp_path / "deleted" / "123-gone"
    (tombstone / "0").mkdir(parents=True)
    (tombstone / "0" / "00000000000000000000.log").write_bytes(b"x" * 100)
    half_created = tmp_path / "streams" / "half"
    (half_created / "0").mkdir(parents=True)

    async def check() -> None:
        async with running(config) as broker:
            assert "half" not in broker.streams
            broker.create_stream("half")
            assert broker.partition("half", 0).log.high_watermark == -1

    asyncio.run(check())
    assert not tombstone.exists()


def test_a_failed_create_leaves_no_directory_and_no_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening the 5th partition's log fails (the descriptor limit): the stream does not exist,
    its directory is gone, and the partitions opened before are closed."""
    import tidelog.broker.partition as partition_module

    real = partition_module.SegmentedLog
    opened: list[object] = []

    def failing_log(directory: Path, *args: object, **kwargs: object) -> object:
        if Path(directory).name == "4":
            raise OSError(errno.EMFILE, "Too many open files", str(directory))
        log = real(directory, *args, **kwargs)  # type: ignore[arg-type]
        opened.append(log)
        return log

    async def scenario() -> None:
        async with running(broker_config(tmp_path)) as broker:
            fds_before = len(os.listdir("/proc/self/fd"))
            monkeypatch.setattr(partition_module, "SegmentedLog", failing_log)
            with pytest.raises(OutOfDescriptors, match="file descriptors"):
                broker.create_stream("s", StreamConfig(partitions=8))
            monkeypatch.setattr(partition_module, "SegmentedLog", real)
            assert len(opened) == 4
            assert "s" not in broker.streams
            assert not (tmp_path / "streams" / "s").exists()
            assert len(os.listdir("/proc/self/fd")) <= fds_before
            broker.create_stream("s", StreamConfig(partitions=8))  # the name is free

    asyncio.run(scenario())


def test_a_delete_whose_rename_fails_removes_the_stream_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tombstone rename fails (an I/O error on the directory): the delete still completes,
    the logs are closed, nothing of the stream stays on disk or comes back at a restart."""
    import tidelog.broker.deletion as deletion_module

    config = broker_config(tmp_path)

    def failing_rename(source: object, target: object) -> None:
        raise OSError(errno.EIO, "Input/output error", str(source))

    async def delete() -> None:
        async with running(config) as broker:
            broker.create_stream("s", StreamConfig(partitions=4))
            for number in range(4):
                await broker.publish("s", number, [b"x"] * 10)
            fds_with_stream = len(os.listdir("/proc/self/fd"))
            monkeypatch.setattr(deletion_module.os, "rename", failing_rename)
            await broker.delete_stream("s")
            monkeypatch.undo()
            assert "s" not in broker.streams
            assert not (tmp_path / "streams" / "s").exists()
            assert len(os.listdir("/proc/self/fd")) <= fds_with_stream
            broker.create_stream("s")  # the name is free

    async def check() -> None:
        async with running(config) as broker:
            assert broker.partition("s", 0).log.high_watermark == -1
            assert len(broker.stream("s").partitions) == 1

    asyncio.run(delete())
    asyncio.run(check())


@pytest.mark.parametrize("rename_fails", [False, True])
def test_a_create_whose_metadata_cannot_be_written_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rename_fails: bool
) -> None:
    """``stream.json`` cannot be written (a full disk): the create fails with ``DiskFull``, the
    partitions' logs are closed without writing, and the directory goes (moved aside, or removed
    in place when even the move fails)."""
    import tidelog.broker.deletion as deletion_module
    from tidelog.broker.stream import Stream

    def full_disk(self: Stream) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.directory))

    async def scenario() -> None:
        async with running(broker_config(tmp_path)) as broker:
            fds_before = len(os.listdir("/proc/self/fd"))
            monkeypatch.setattr(Stream, "save", full_disk)
            if rename_fails:

                def failing_rename(source: object, target: object) -> None:
                    raise OSError(errno.EIO, "Input/output error", str(source))

                monkeypatch.setattr(deletion_module.os, "rename", failing_rename)
            with pytest.raises(DiskFull, match="disk space"):
                broker.create_stream("s", StreamConfig(partitions=4))
            monkeypatch.undo()
            assert "s" not in broker.streams
            assert not (tmp_path / "streams" / "s").exists()
            assert len(os.listdir("/proc/self/fd")) <= fds_before
            broker.create_stream("s", StreamConfig(partitions=4))

    asyncio.run(scenario())


# -- internal streams ----------------------------------------------------------------------------


def test_clients_cannot_write_pause_or_freeze_internal_streams(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(broker_config(tmp_path)) as broker:
            with pytest.raises(PermissionDenied, match="internal"):
                await broker.publish(CURSORS_STREAM, 0, [b"forged"])
            with pytest.raises(PermissionDenied, match="internal"):
                await broker.publish_idempotent(CURSORS_STREAM, 0, [b"forged"], "p", 0)
            with pytest.raises(PermissionDenied, match="internal"):
                broker.pause(CURSORS_STREAM, None, False)
            with pytest.raises(PermissionDenied, match="internal"):
                broker.set_readonly(CURSORS_STREAM, None, True)
            with pytest.raises(PermissionDenied, match="internal"):
                await broker.delete_stream(CURSORS_STREAM)
            with pytest.raises(InvalidArgument):
                broker.create_stream("__mine")
            # The broker itself still writes cursors, and nothing was paused or frozen.
            broker.create_stream("s")
            await broker.cursors.set("c", "s", 0, 41)
            assert await broker.cursors.fetch("c", "s", 0) == 41
            stream = broker.stream(CURSORS_STREAM)
            assert not any(p.paused or p.readonly for p in stream.partitions)
            assert all(p.log.high_watermark <= 0 for p in stream.partitions)

    asyncio.run(scenario())


def test_an_internal_stream_frozen_by_an_older_release_is_repaired_at_start(
    tmp_path: Path,
) -> None:
    """Data directories written before the broker refused it may hold a read-only or paused
    ``__cursors``; start-up clears both (cursors work again) and says so in the log."""
    config = broker_config(tmp_path)

    async def freeze() -> None:
        async with running(config) as broker:
            stream = broker.stream(CURSORS_STREAM)
            for partition in stream.partitions:
                partition.set_readonly(True)
            stream.partitions[0].pause()
            stream.save()

    async def check() -> None:
        async with running(config) as broker:
            broker.create_stream("s")
            await broker.cursors.set("c", "s", 0, 5)
            assert await broker.cursors.fetch("c", "s", 0) == 5
            assert not any(p.readonly for p in broker.stream(CURSORS_STREAM).partitions)

    asyncio.run(freeze())
    asyncio.run(check())


def test_delete_of_an_unknown_stream_is_not_found(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running(broker_config(tmp_path)) as broker:
            with pytest.raises(StreamNotFound):
                await broker.delete_stream("nope")

    asyncio.run(scenario())


def test_an_internal_stream_takes_its_owners_settings_at_every_open(tmp_path: Path) -> None:
    """The owner of an internal stream (the sites' delta queue) decides its segment size and
    retention; settings changed between two starts apply to the stored stream, at once and
    after a restart, without touching its records."""
    config = broker_config(tmp_path)
    before = StreamConfig(retention_bytes=None)
    after = StreamConfig(segment_max_bytes=4096, retention_bytes=8192, retention_age_s=60.0)

    async def first() -> None:
        async with running(config) as broker:
            stream = broker.internal_stream("__owned", before)
            await stream.partitions[0].publish([b"kept"])

    async def second() -> None:
        async with running(config) as broker:
            stream = broker.internal_stream("__owned", after)
            assert stream.config == after
            log = stream.partitions[0].log
            assert (log.config.segment_max_bytes, log.config.retention_bytes) == (4096, 8192)
            assert [v for b in log.forward_reader(0) for v in b.values()] == [b"kept"]
            with pytest.raises(ValueError, match="partition count"):
                broker.internal_stream("__owned", StreamConfig(partitions=2))

    async def third() -> None:
        async with running(config) as broker:
            assert broker.stream("__owned").config == after

    asyncio.run(first())
    asyncio.run(second())
    asyncio.run(third())


def test_view_status_while_views_are_declared_and_dropped(tmp_path: Path) -> None:
    """ListViews races DeclareView/DropView (a cluster reconciles views while queries come):
    every status lists whole views, never fails on one dropped meanwhile."""

    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            broker.create_stream("s", StreamConfig(partitions=2))
            views = broker.views("s")
            for round_ in range(40):
                name = f"v{round_}"
                await broker.declare_view("s", ViewSpec(name, ViewKind.TABLE))
                statuses = await asyncio.gather(
                    views.status(), broker.drop_view("s", name), views.status(), views.status()
                )
                for found in (statuses[0], statuses[2], statuses[3]):
                    assert found is not None
                    assert all(len(applied) == 2 for _, applied, _ in found)

    asyncio.run(main())
