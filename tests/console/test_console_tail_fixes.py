"""The live tail's and the messages page's edges, request by request against the in-memory broker
of ``test_console_display.py``: a tail that ends says so once (no stale id to reconnect with, a
204 when asked again from a finished cursor), a search goes on by itself only away from the live
page and for a bounded number of steps, positions and times out of range are a 400 naming the
field, a client's cursor must look like the server's tokens, a group's lag leaves out hidden
streams, and an unclustered answer of any kind is kept for the TTL."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import grpc
import pytest
from tests.console.test_console_display import T0, FakeBroker, console, message, table, text_of

from tidelog.client import BrowsePage, GroupInfo, GroupMemberInfo, PartitionInfo, StreamInfo
from tidelog.client.errors import error_for
from tidelog.console.query import SEARCH_STEPS
from tidelog.console.sampler import CursorKey


def test_a_tail_past_until_ends_once_without_a_stale_id() -> None:
    broker = FakeBroker(messages=[message(7, b"k")])
    answer = console(broker).get("/streams/orders/tail?until=2026-01-01&cursor=t1")
    assert answer.status == 200
    assert "id: t1" not in answer.body  # a reconnect from it would send these rows again
    assert answer.body.rstrip().endswith("event: end\ndata:")
    assert answer.body.count("<tr") == 1


def test_a_tail_asked_again_from_a_finished_cursor_answers_204() -> None:
    broker = FakeBroker()
    answer = console(broker).get("/streams/orders/tail?cursor=t1", last_event_id="t1")
    assert answer.status == 204 and answer.body == ""


class Exhausted(FakeBroker):
    """Every browse scans its budget and finds nothing, with a token to go on from."""

    async def browse(self, stream: str, **args: Any) -> BrowsePage:
        self.browsed.append(args)
        return BrowsePage((), "t9", 100_000, True, None)


def test_a_search_goes_on_by_itself_only_from_a_page_that_is_not_live() -> None:
    client = console(Exhausted())
    live = client.get("/streams/orders/messages?key=absent")
    assert live.status == 200 and 'id="tail"' in live.body
    assert "data-go-on" not in live.body  # it would leave the page, and a tail started there
    assert 'id="continue-search"' in live.body and "goes on by itself" in live.body
    older = client.get("/streams/orders/messages?key=absent&token=t8&searched=5")
    assert "data-go-on=" in older.body and 'id="stop-search"' in older.body


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/streams/orders/messages?above=1:1099511627776:0", "above"),
        ("/streams/orders/messages?above=18446744073709551616:0:0", "above"),
        ("/streams/orders/messages?above=1:2", "above"),
        ("/streams/orders/export.csv?above=1:0:9223372036854775808", "above"),
        ("/streams/orders/tail?after=1:1099511627776:0", "after"),
        ("/streams/orders/messages?partition=1099511627776", "partition"),
        ("/streams/orders/messages?partition=0&offset=9223372036854775808", "offset"),
        ("/streams/orders/messages?until=3000-01-01", "until"),
        ("/streams/orders/messages?since=9999-12-31", "since"),
        ("/streams/orders/tail?until=3000-01-01", "until"),
    ],
)
def test_a_position_or_time_out_of_range_is_a_400_naming_the_field(path: str, field: str) -> None:
    broker = FakeBroker()
    answer = console(broker).get(path)
    assert answer.status == 400, answer.body[:300]
    assert f"{field}:" in text_of(answer) and "Something went wrong" not in answer.body
    assert broker.browsed == []


def test_a_position_and_a_time_in_range_are_taken() -> None:
    broker = FakeBroker()
    client = console(broker)
    assert client.get("/streams/orders/messages?above=5:1:9").status == 200
    assert broker.browsed[-1]["anchor"] == (5, 1, 9)
    assert client.get("/streams/orders/messages?until=2262-04-10").status == 200


@pytest.mark.parametrize(
    "cursor", ["t1\nevent: end", "t1\rretry: 1", "a b", "x" * 5000, "ab=", "a%0Ab"]
)
def test_a_cursor_unlike_the_servers_tokens_is_a_400_and_never_echoed(cursor: str) -> None:
    broker = FakeBroker(messages=[message(7, b"k")])
    client = console(broker)
    by_url = client.get(f"/streams/orders/tail?cursor={quote(cursor)}")
    assert by_url.status == 400 and "cursor:" in text_of(by_url)
    if "\n" not in cursor and "\r" not in cursor:  # a header cannot carry a line break
        by_header = client.get("/streams/orders/tail", last_event_id=cursor)
        assert by_header.status == 400
    assert broker.browsed == []


def test_a_cursor_as_the_server_writes_them_is_taken() -> None:
    broker = FakeBroker(messages=[message(7, b"k")])
    answer = console(broker).get("/streams/orders/tail?cursor=AbC-_09")
    assert answer.status == 200 and broker.browsed[0]["token"] == "AbC-_09"


def test_a_new_tail_with_nothing_to_come_says_it_ended() -> None:
    answer = console(FakeBroker()).get("/streams/orders/tail?until=2000-01-01")
    assert answer.status == 200 and "event: end" in answer.body  # a 204 would be retried


def test_a_groups_lag_leaves_out_the_streams_the_visitor_may_not_see() -> None:
    def stream(name: str, newest: int) -> StreamInfo:
        return StreamInfo(name, name, T0, (PartitionInfo(0, newest, newest, False, False, ""),))

    group = GroupInfo(
        "billing",
        1,
        (GroupMemberInfo("c1", ("orders", "secret"), 1.0),),
        {"c1": {"orders": (0,), "secret": (0,)}},
    )
    broker = FakeBroker(streams=[stream("orders", 100), stream("secret", 5000)], groups=[group])
    client = console(broker)
    shown = client.app.state.console
    shown.may_see = lambda request, kind, name: name != "secret"
    shown.sampler.cursors.update(
        {
            CursorKey("__group:billing", "orders", 0): 90,  # lag 10
            CursorKey("__group:billing", "secret", 0): 1000,  # lag 4000, not to be counted
        }
    )
    groups = table(client.get("/consumers"), "groups")
    assert re.search(r'class="n group-lag"[^>]*>10\s*<', groups), groups
    assert "unknown" not in groups and "secret" not in groups


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.UNAVAILABLE,
    ],
)
def test_a_server_that_cannot_say_if_it_is_clustered_is_asked_once_per_ttl(
    code: grpc.StatusCode,
) -> None:
    asked: list[str] = []

    class Refusing(FakeBroker):
        async def cluster_status(self, stream: str = "", timeout: float = 10.0) -> Any:
            asked.append(stream)
            raise error_for(code, "no")

    client = console(Refusing())
    for _ in range(3):
        assert client.get("/streams/orders").status == 200
    assert len(asked) == 1  # each ask may wait 3 s: not on every page


def test_a_search_stops_going_on_by_itself_after_its_steps() -> None:
    client = console(Exhausted())
    base = "/streams/orders/messages?key=absent&token=t8&searched=5"
    going = client.get(f"{base}&steps={SEARCH_STEPS - 1}")
    assert f"steps={SEARCH_STEPS}" in going.body.split("data-go-on=", 1)[1].split('"')[1]
    last = client.get(f"{base}&steps={SEARCH_STEPS}")
    assert "data-go-on" not in last.body and 'id="continue-search"' in last.body
    resumed = re.search(r'id="continue-search" href="([^"]+)"', last.body)
    assert resumed and "steps=" not in resumed.group(1)  # a click allows as many again
