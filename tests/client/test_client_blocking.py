"""The blocking ``Client`` has every method of ``AsyncClient`` (docs/api.md says so), the three
that lacked one tested here against a real server: ``open_subscription``, ``publisher`` and
``transmit_snapshot``."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

from tidelog.client import AsyncClient, Client, FailedPrecondition, NotFound
from tidelog.client.codec import decode


def public(kind: type) -> set[str]:
    return {name for name in dir(kind) if not name.startswith("_")}


def test_the_blocking_client_has_every_method_of_the_async_one() -> None:
    assert public(AsyncClient) - public(Client) == set()


def test_open_subscription_is_open_when_it_returns(server: ServerProcess, stream: str) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        client.publish_batch(stream, [b"a", b"b"])
        batches = client.open_subscription(stream, start="new")  # open: "new" is from here
        client.publish(stream, b"c")
        first = next(batches)
        assert [m.value for m in decode(first, stream, 0)] == [b"c"]
        old = client.open_subscription(stream, start="earliest", stop="latest")
        assert [m.value for batch in old for m in decode(batch, stream, 0)] == [b"a", b"b", b"c"]


def test_the_blocking_publisher_pipelines_and_acknowledges_in_order(
    server: ServerProcess, stream: str
) -> None:
    with Client(server.address) as client:
        client.create_stream(stream)
        with client.publisher(stream) as publisher:
            assert list(publisher.publish([b"a", b"b"]).offsets) == [0, 1]
            sent = [publisher.send([b"%d" % n]) for n in range(20)]  # in flight together
            assert [list(future.result(10).offsets) for future in sent] == [
                [2 + n] for n in range(20)
            ]
            last = publisher.send([b"last"])
        assert list(last.result(10).offsets) == [22]  # answered, though closed meanwhile
        values = [m.value for m in client.subscribe(stream, start="earliest", stop="latest")]
        assert values == [b"a", b"b", *(b"%d" % n for n in range(20)), b"last"]


def test_transmit_snapshot_reaches_the_site(tmp_path: Path) -> None:
    """A server of site ``a`` that declared site ``b``: the call names the site and the
    snapshot (``b`` waits for none, so it is refused saying which it got), and an unknown site
    is NotFound."""
    with served(tmp_path / "a", "--site-id", "a") as site, Client(site.address) as client:
        client.add_site("b", "127.0.0.1:1")
        with pytest.raises(FailedPrecondition, match="not snapshot 99"):
            client.transmit_snapshot("b", 99, [("app", b"state")], begin=True)
        with pytest.raises(NotFound):
            client.transmit_snapshot("nowhere", 1, iter([("app", b"state")]), end=True)
