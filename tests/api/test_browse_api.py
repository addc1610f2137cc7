"""``tidelog.v1/Browse`` against a real server, through both clients: merged pages, tokens,
filters, and the status of every kind of bad input."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess, served

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc
from tidelog.client import AsyncClient, BrowsePage, Client, InvalidArgument, NotFound

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with served(Path(tmp_path_factory.mktemp("browse")) / "data") as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[Client]:
    with Client(server.address) as connected:
        yield connected


@pytest.fixture(scope="module")
def filled(client: Client) -> str:
    """Stream ``mixed``: 3 partitions, 60 messages published round-robin one at a time, keys
    ``k0``..``k4``, a header ``parity`` and values ``value-<i>``."""
    client.create_stream("mixed", partitions=3)
    for i in range(60):
        client.publish(
            "mixed",
            f"value-{i}".encode(),
            key=f"k{i % 5}".encode(),
            headers={"parity": b"even" if i % 2 == 0 else b"odd"},
            partition=i % 3,
        )
    return "mixed"


def _order(page: BrowsePage) -> list[tuple[int, int, int]]:
    return [(m.timestamp, m.partition, m.offset) for m in page.messages]


def test_newest_first_is_the_merged_order_and_tokens_walk_it_all(
    client: Client, filled: str
) -> None:
    everything = sorted(
        (m.timestamp, m.partition, m.offset)
        for p in range(3)
        for m in client.subscribe(filled, p, start="earliest", stop="latest")
    )
    page = client.browse(filled, limit=7)
    assert page.messages[0].value == b"value-59"  # published last
    walked, token, pages = _order(page), page.next_token, 1
    while token is not None:
        page = client.browse(filled, limit=7, token=token)
        walked += _order(page)
        token, pages = page.next_token, pages + 1
    assert walked == everything[::-1]
    assert pages >= 60 // 7

    forward = client.browse(filled, limit=25, newest_first=False)
    rest = client.browse(filled, limit=100, newest_first=False, token=forward.next_token)
    assert _order(forward) + _order(rest) == everything
    # At the live end an oldest-first page keeps a token: the next one continues with what
    # arrives later.
    assert rest.next_token is not None
    client.publish(filled, b"late", partition=1)
    later = client.browse(filled, newest_first=False, token=rest.next_token)
    assert [m.value for m in later.messages] == [b"late"]
    assert all(m.stream == filled for m in later.messages)


def test_filters_on_the_server(client: Client, filled: str) -> None:
    by_key = client.browse(filled, key="k3", limit=100)
    assert {m.key for m in by_key.messages} == {b"k3"}
    assert len(by_key.messages) == 12
    prefix = client.browse(filled, key_prefix=b"k", headers={"parity": "odd"}, limit=100)
    assert {m.headers["parity"] for m in prefix.messages} == {b"odd"}
    grep = client.browse(filled, contains="ue-4", limit=100)
    assert sorted(m.value for m in grep.messages) == sorted(
        f"value-{i}".encode() for i in [4, *range(40, 50)]
    )
    one = client.browse(filled, partitions=[2], limit=100, until=datetime.now(UTC))
    assert {m.partition for m in one.messages} == {2}
    # Floored to the microsecond a datetime holds, so that the bound is at or before it.
    middle = EPOCH + timedelta(microseconds=by_key.messages[5].timestamp // 1000)
    since = client.browse(filled, key="k3", since=middle, limit=100)
    assert [m.offset for m in since.messages] == [m.offset for m in by_key.messages[:6]]


def test_a_budget_says_how_far_it_got(client: Client, filled: str) -> None:
    page = client.browse(filled, key="nothing-has-this", max_scan=10)
    assert (tuple(page.messages), page.scanned, page.budget_exhausted) == ((), 10, True)
    assert page.reached_timestamp is not None and page.next_token is not None
    on = client.browse(filled, key="nothing-has-this", token=page.next_token, max_scan=1000)
    assert on.budget_exhausted is False and on.next_token is None
    assert on.reached_timestamp is not None and on.reached_timestamp <= page.reached_timestamp


def test_the_async_client_browses_too(server: ServerProcess, filled: str) -> None:
    async def newest() -> BrowsePage:
        async with AsyncClient(server.address) as aclient:
            return await aclient.browse(filled, limit=3, start=datetime.now(UTC))

    page = asyncio.run(newest())
    assert len(page.messages) == 3
    assert _order(page) == sorted(_order(page), reverse=True)


def test_statuses_for_bad_input(server: ServerProcess, client: Client, filled: str) -> None:
    with pytest.raises(NotFound, match="nope"):
        client.browse("nope")
    with pytest.raises(NotFound):
        client.browse(filled, partitions=[7])
    cases = {
        "not base64!": "browse token is not valid base64",
        "Zm9vYmFy": "browse token is damaged",
    }
    for token, message in cases.items():
        with pytest.raises(InvalidArgument, match=message) as failure:
            client.browse(filled, token=token)
        assert "browse again without a token" in str(failure.value)
    newest = client.browse(filled, limit=1).next_token
    with pytest.raises(InvalidArgument, match="continues newest-first pages"):
        client.browse(filled, newest_first=False, token=newest)
    client.create_stream("other")
    with pytest.raises(InvalidArgument, match="belongs to stream 'mixed'"):
        client.browse("other", token=newest)
    with pytest.raises(InvalidArgument, match=r"since .* is after until"):
        client.browse(filled, since=datetime(2030, 1, 1, tzinfo=UTC), until=datetime(2020, 1, 1))
    with pytest.raises(InvalidArgument, match=r"limit must be 1\.\.10000"):
        client.browse(filled, limit=10_001)

    with grpc.insecure_channel(server.address) as channel:
        stub = v1_grpc.TidelogStub(channel)
        bad = {
            "no stream": v1.BrowseRequest(),
            "negative seconds": v1.BrowseRequest(stream=filled, max_scan_seconds=-1),
            "too long a scan": v1.BrowseRequest(stream=filled, max_scan_seconds=3600),
            "empty header name": v1.BrowseRequest(
                stream=filled, filter=v1.BrowseFilter(headers=[v1.Header(name="", value=b"")])
            ),
        }
        for name, request in bad.items():
            with pytest.raises(grpc.RpcError) as failure:
                stub.Browse(request, timeout=10)
            assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT, name


def test_internal_streams_are_browsed_like_any_other(client: Client) -> None:
    """Clients read internal streams with the usual calls (only writes are refused)."""
    client.set_cursor("c1", "mixed", 0, 5)
    page = client.browse("__cursors", limit=10)
    assert page.messages and all(m.stream == "__cursors" for m in page.messages)


def test_an_anchor_starts_at_a_message_of_a_batch_sharing_one_timestamp(client: Client) -> None:
    client.create_stream("batched", partitions=2)
    for partition in (0, 1):
        client.publish_batch(
            "batched", [b"p%d-%d" % (partition, i) for i in range(300)], partition=partition
        )
    everything = _order(client.browse("batched", limit=1000, newest_first=False))
    assert len({t for t, _, _ in everything}) <= 2  # one timestamp per batch
    middle = everything[450]
    after = client.browse("batched", limit=5, newest_first=False, anchor=middle)
    assert _order(after) == everything[451:456]
    at = client.browse("batched", limit=5, anchor=middle, include_anchor=True)
    assert _order(at) == everything[446:451][::-1]
    with pytest.raises(InvalidArgument, match="partition and offset are >= 0"):
        client.browse("batched", anchor=(0, -1, 0))
