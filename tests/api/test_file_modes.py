"""Every file of a data directory is 0600 and every directory 0700 after use, whatever the
umask (``tidelog.durable``): segments, indexes, JSON state, views, cursors, groups, locks.
In process tidelog's own files are so under an umask of 0; ``tidelog serve`` sets the umask to
077 as well, which covers RocksDB's files in the views."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from tests.broker.brokertools import broker_config, running
from tests.support.server import served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.broker import StreamConfig
from tidelog.log import NewRecord


def modes(root: Path, *, skip: str = "") -> Iterator[tuple[Path, int]]:
    yield root, stat.S_IMODE(root.stat().st_mode)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            if skip and skip in path.relative_to(root).parts:
                continue
            yield path, stat.S_IMODE(path.lstat().st_mode)


def wrong(root: Path, *, skip: str = "") -> list[str]:
    return [
        f"{path.relative_to(root.parent)}: {mode:o}"
        for path, mode in modes(root, skip=skip)
        if mode != (0o700 if path.is_dir() else 0o600)
    ]


def test_the_broker_makes_its_files_private_under_any_umask(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = os.umask(0)
    try:

        async def body() -> None:
            async with running(broker_config(data)) as broker:
                broker.create_stream("s", StreamConfig(partitions=2))
                await broker.publish("s", 0, [NewRecord(b"v", key=b"k")], durable=True)
                await broker.cursors.set("c", "s", 0, 1)
                broker.groups.join("g", "c", ["s"])
                await broker.group_writer.saved()
                await broker.delete_stream("s")
                broker.create_stream("t")

        asyncio.run(body())
    finally:
        os.umask(old)
    assert (data / "groups.json").exists()
    assert not wrong(data), wrong(data)


def test_a_served_data_directory_is_private_views_included(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with served(data) as server:
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            api.CreateStream(pb.CreateStreamRequest(subject="s", name="s", partitions=2))
            api.Publish(pb.PublishRequest(stream="s", key=b"k", value=b"v", ackPolicy=pb.ALL))
            api.SetCursor(pb.SetCursorRequest(cursorId="c", stream="s", offset=1))
            api.JoinConsumerGroup(
                pb.JoinConsumerGroupRequest(groupId="g", consumerId="c", streams=["s"])
            )
            tidelog = v1_grpc.TidelogStub(channel)
            spec = v1.ViewSpec(name="latest", kind=v1.VIEW_KIND_TABLE)
            tidelog.DeclareView(v1.DeclareViewRequest(stream="s", view=spec))
            assert tidelog.ViewGet(v1.ViewGetRequest(stream="s", view="latest", key=b"k")).found
        assert server.stop() == 0
    assert any(p.name == "CURRENT" for p, _ in modes(data)), "a RocksDB store was written"
    assert not wrong(data), wrong(data)


def start_and_stop(data: Path) -> None:
    async def body() -> None:
        async with running(broker_config(data)) as broker:
            broker.create_stream("s")

    asyncio.run(body())


def test_a_data_directory_owned_by_another_user_is_left_as_it_is_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Kubernetes volume owned by root with an fsGroup: not ours to chmod, so not changed
    (and the start does not fail on it); the warning names the mode and what it exposes."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o2775)
    owner = data.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    with caplog.at_level(logging.WARNING, logger="tidelog"):
        start_and_stop(data)
    assert stat.S_IMODE(data.stat().st_mode) == 0o2775
    assert "mode 2775" in caplog.text and "delete or replace" in caplog.text
    assert not wrong(data / "streams"), wrong(data / "streams")


def test_a_refused_chmod_of_the_data_directory_is_a_warning_not_a_failed_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o750)
    chmod = os.chmod

    def refused(path: object, mode: int, **kwargs: object) -> None:
        if Path(str(path)) == data:
            raise PermissionError(1, "Operation not permitted", str(path))
        chmod(path, mode, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "chmod", refused)
    with caplog.at_level(logging.WARNING, logger="tidelog"):
        start_and_stop(data)
    assert "mode 750" in caplog.text and "chmod was refused" in caplog.text
    assert "listed by others" in caplog.text


def test_an_owned_data_directory_left_open_by_an_older_release_is_made_private(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    start_and_stop(data)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
