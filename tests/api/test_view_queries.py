"""Materialised views over a real server: declared at creation or later, queried through the
client, kept across restarts, rebuilt after kill -9 to exactly what the log says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess

from tidelog.client import (
    AlreadyExists,
    Client,
    InvalidArgument,
    Message,
    NotFound,
    View,
    ViewEntry,
)


@pytest.fixture
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as connected:
        yield connected


def test_views_declared_at_creation_answer_every_query(client: Client) -> None:
    client.create_stream(
        "orders", partitions=2, views=[View.table("latest"), View.window("recent", 1000)]
    )
    for i in range(40):
        client.publish("orders", f"v{i}".encode(), key=f"k{i % 5}".encode())
    latest = client.view_get("orders", "latest", b"k3")
    assert latest is not None and latest.value == b"v38"
    assert client.view_get("orders", "latest", b"nope") is None
    keys = [e.key for e in client.view_range("orders", "latest")]
    assert keys == [b"k0", b"k1", b"k2", b"k3", b"k4"]
    assert [e.key for e in client.view_range("orders", "latest", reverse=True, limit=2)] == [
        b"k4",
        b"k3",
    ]
    assert [e.key for e in client.view_range("orders", "latest", b"k1", b"k3")] == [
        b"k1",
        b"k2",
        b"k3",
    ]
    every = client.window_fetch("orders", "recent", b"k2")
    assert [e.value for e in every] == [f"v{i}".encode() for i in range(2, 40, 5)]
    last3 = client.last_values("orders", "recent", b"k2", 3)
    assert [e.value for e in last3] == [b"v37", b"v32", b"v27"]
    assert last3 == client.window_fetch("orders", "recent", b"k2", backward=True)[:3]
    # Time bounds apply to the records' timestamps (ms).
    middle = every[3].timestamp // 1_000_000
    bounded = client.window_fetch("orders", "recent", b"k2", middle, None)
    assert bounded[0].timestamp // 1_000_000 >= middle
    assert all(e.window_start_ms <= e.timestamp // 1_000_000 for e in bounded)
    statuses = {s.view.name: s for s in client.list_views("orders")}
    assert statuses["latest"].view == View.table("latest")
    assert statuses["recent"].view == View.window("recent", 1000)
    assert sum(statuses["recent"].applied_offsets) == 40


def test_a_view_declared_later_is_built_from_the_log(client: Client) -> None:
    client.create_stream("later")
    client.publish_batch("later", [Message(b"old", key=b"a"), Message(b"new", key=b"a")])
    client.declare_view("later", View.table("t"))
    client.declare_view("later", View.table("t"))  # identical: nothing happens
    found = client.view_get("later", "t", b"a")
    assert found is not None and (found.value, found.offset) == (b"new", 1)
    with pytest.raises(AlreadyExists, match="view already exists"):
        client.declare_view("later", View.window("t", 10))
    client.drop_view("later", "t")
    with pytest.raises(NotFound, match="no such view"):
        client.view_get("later", "t", b"a")


def test_errors_are_clear(client: Client) -> None:
    client.create_stream("e", views=[View.table("t"), View.window("w", 100)])
    with pytest.raises(NotFound, match="no such stream"):
        client.view_get("missing", "t", b"a")
    with pytest.raises(NotFound, match="no such view"):
        client.view_range("e", "missing")
    with pytest.raises(InvalidArgument, match="window view; query it with WindowFetch"):
        client.view_get("e", "w", b"a")
    with pytest.raises(InvalidArgument, match="table view"):
        client.window_fetch("e", "t", b"a")
    with pytest.raises(InvalidArgument, match="from_key is after to_key"):
        client.view_range("e", "t", b"z", b"a")
    with pytest.raises(InvalidArgument, match="time_from_ms 5 is after time_to_ms 4"):
        client.window_fetch("e", "w", b"a", 5, 4)
    with pytest.raises(InvalidArgument, match="window size"):
        client.declare_view("e", View.window("bad", 0))
    with pytest.raises(InvalidArgument, match="invalid view name"):
        client.declare_view("e", View.table("no/slash"))
    with pytest.raises(InvalidArgument, match="limit"):
        client.view_range("e", "t", limit=10**9)
    with pytest.raises(InvalidArgument, match=r"partitions 0\.\.0"):
        client.view_range("e", "t", partition=3)


def test_views_survive_a_graceful_restart(tmp_path: Path) -> None:
    process = ServerProcess(tmp_path / "data").start()
    try:
        with Client(process.address) as client:
            client.create_stream("s", views=[View.table("t"), View.window("w", 50)])
            client.publish_batch("s", [Message(f"{i}".encode(), key=b"k") for i in range(100)])
            before = client.window_fetch("s", "w", b"k", limit=1000)
        process.stop()
        process.start()
        with Client(process.address) as client:
            assert client.window_fetch("s", "w", b"k", limit=1000) == before
            found = client.view_get("s", "t", b"k")
            assert found is not None and found.value == b"99"
            client.publish("s", b"100", key=b"k")
            assert len(client.window_fetch("s", "w", b"k", limit=1000)) == 101
    finally:
        process.kill()


def _log_contents(client: Client, stream: str) -> list[ViewEntry]:
    """Every keyed record of the stream, as a window view would hold it (oldest first)."""
    records = []
    for p in client.stream_info(stream).partitions:
        if p.newest_offset < 0:
            continue
        for m in client.subscribe(stream, p.partition, start="earliest", stop="latest"):
            if m.key is not None:
                records.append(ViewEntry(m.key, m.value, p.partition, m.offset, m.timestamp))
    return records


def test_kill_9_mid_stream_leaves_views_equal_to_a_rebuild_from_the_log(tmp_path: Path) -> None:
    process = ServerProcess(tmp_path / "data").start()
    try:
        with Client(process.address) as client:
            client.create_stream(
                "busy", partitions=2, views=[View.table("t"), View.window("w", 20)]
            )
        stop = threading.Event()
        published = [0]

        def publish() -> None:
            try:
                with Client(process.address) as client:
                    i = 0
                    while not stop.is_set() and i < 200_000:
                        batch = [
                            Message(f"v{i + j}".encode(), key=f"k{(i + j) % 7}".encode())
                            for j in range(50)
                        ]
                        client.publish_batch("busy", batch, partition=(i // 50) % 2)
                        i += 50
                        published[0] = i
            except Exception:  # the server dies under it: expected
                pass

        writer = threading.Thread(target=publish, daemon=True)
        writer.start()
        deadline = time.monotonic() + 20
        while published[0] < 5000 and time.monotonic() < deadline:
            time.sleep(0.05)
        process.kill()  # SIGKILL while publishing and applying
        stop.set()
        writer.join(timeout=10)
        assert published[0] >= 5000
        process.start()
        with Client(process.address) as client:
            records = _log_contents(client, "busy")
            assert len(records) >= 5000
            order = sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))
            for partition in (0, 1):
                latest: dict[bytes, ViewEntry] = {}
                for r in order:
                    if r.partition == partition:
                        latest[r.key] = r
                table = client.view_range("busy", "t", limit=1000, partition=partition)
                assert [(e.key, e.value, e.offset) for e in table] == [
                    (k, latest[k].value, latest[k].offset) for k in sorted(latest)
                ]
            newest = {r.key: r for r in order}
            for key, r in newest.items():
                found = client.view_get("busy", "t", key)
                assert found is not None and (found.partition, found.offset) == (
                    r.partition,
                    r.offset,
                )
            for key in sorted(newest):
                mine = sorted(
                    (r for r in records if r.key == key),
                    key=lambda r: (r.timestamp, r.partition, r.offset),
                )
                got = client.window_fetch("busy", "w", key, limit=100_000)
                assert [(e.partition, e.offset, e.value) for e in got] == [
                    (r.partition, r.offset, r.value) for r in mine
                ]
    finally:
        process.kill()
