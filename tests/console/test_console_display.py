"""What the console's pages show, request by request against a broker faked in memory (no
network): long keys cut in lists, text and hex keys told apart, a bad ``count`` refused, lag per
consumer group, the brokers of a cluster (a stopped one stays, down) with one offset convention,
the replication page's advice, a 405 titled as such, and no leadership nor repeated subject on a
single broker."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from tests.console.asgitools import Answer, Browser

from tidelog.client import (
    BrowsePage,
    ClusterStatus,
    FailedPrecondition,
    GroupInfo,
    GroupMemberInfo,
    PartitionDetails,
    PartitionInfo,
    PartitionReplicas,
    ReceivedMessage,
    SiteStatus,
    StreamDetails,
    StreamInfo,
    StreamSettings,
    View,
    ViewEntry,
    ViewStatus,
)
from tidelog.client.cluster_calls import ClusterBroker, ReplicaProgress
from tidelog.console import ConsoleConfig, OpenGate, create_app
from tidelog.console.sampler import CursorKey

T0 = 1_795_600_000_000_000_000
SETTINGS = StreamSettings(None, None, None, False, 1 << 20, 3600.0, 1 << 20, None, False, "")


def info(name: str, partitions: int = 1, subject: str = "") -> StreamInfo:
    parts = tuple(
        PartitionInfo(p, 9, 9, False, False, "0c1e76d262b277c0") for p in range(partitions)
    )
    return StreamInfo(name, subject or name, T0, parts)


@dataclass
class FakeBroker:
    """The calls the console's pages make, answered from memory; ``browsed`` keeps each
    ``browse`` call's arguments."""

    streams: list[StreamInfo] = field(default_factory=lambda: [info("orders", 2)])
    messages: list[ReceivedMessage] = field(default_factory=list)
    cluster: list[ClusterStatus] = field(default_factory=list)
    groups: list[GroupInfo] = field(default_factory=list)
    sites: list[SiteStatus] = field(default_factory=list)
    browsed: list[dict[str, Any]] = field(default_factory=list)
    values_asked: list[int] = field(default_factory=list)

    async def list_streams(self) -> list[StreamInfo]:
        return self.streams

    async def stream_info(self, name: str) -> StreamInfo:
        return next(s for s in self.streams if s.name == name)

    async def describe_stream(self, name: str) -> StreamDetails:
        found = await self.stream_info(name)
        parts = tuple(
            PartitionDetails(p.partition, 0, 9, 1000, 10, 1000, False, False, 0)
            for p in found.partitions
        )
        return StreamDetails(name, parts, SETTINGS)

    async def cluster_status(self, stream: str = "", timeout: float = 10.0) -> ClusterStatus:
        if not self.cluster:
            raise FailedPrecondition("this server is not part of a cluster")
        return self.cluster.pop(0) if len(self.cluster) > 1 else self.cluster[0]

    async def list_groups(self) -> list[GroupInfo]:
        return self.groups

    async def site_status(self) -> list[SiteStatus]:
        return self.sites

    async def list_views(self, stream: str) -> list[ViewStatus]:
        return [ViewStatus(View.window("per-minute", 60_000), (0,), 1)]

    async def last_values(self, stream: str, view: str, key: bytes, count: int, *a: Any) -> Any:
        self.values_asked.append(count)
        return [ViewEntry(key, b"v", 0, 1, T0, 0)]

    async def browse(self, stream: str, **args: Any) -> BrowsePage:
        self.browsed.append(args)
        return BrowsePage(tuple(self.messages), None, len(self.messages), False, None)

    async def close(self) -> None:
        pass


def console(broker: FakeBroker) -> Browser:
    app = create_app(ConsoleConfig("127.0.0.1:1"), OpenGate(port=9293))
    app.state.console._client = broker
    return Browser(app)


def text_of(answer: Answer) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", answer.body))


def table(answer: Answer, table_id: str) -> str:
    found = re.search(rf'<table[^>]*id="{table_id}".*?</table>', answer.body, re.S)
    assert found, f"no table #{table_id}"
    return found.group(0)


# -- keys and header values ------------------------------------------------------------------------


def message(offset: int, key: bytes | None, headers: dict[str, bytes] | None = None) -> Any:
    return ReceivedMessage(offset, T0 + offset, key, b"v", headers or {}, 0, "orders")


def test_a_long_key_or_header_value_is_cut_in_the_list_with_a_link_to_see_it_whole() -> None:
    huge = b"k" * 100_000
    broker = FakeBroker(messages=[message(7, huge, {"trace": b"h" * 100_000, "x": b"1"})])
    answer = console(broker).get("/streams/orders/messages")
    assert answer.status == 200
    assert "k" * 81 not in answer.body and "h" * 81 not in answer.body
    assert 'href="/streams/orders/messages/0/7" title="see the whole key"' in answer.body
    assert 'title="see the whole header"' in answer.body


def test_text_and_binary_keys_are_shown_apart_and_each_links_to_a_filter_that_finds_it() -> None:
    broker = FakeBroker(messages=[message(1, b"0xdeadbeef"), message(2, b"\xde\xad\xbe\xef")])
    answer = console(broker).get("/streams/orders/messages")
    cells = re.findall(r'<td class="mono key">(.*?)</td>', answer.body)
    assert len(cells) == 2
    text_cell, binary_cell = cells
    assert ">0xdeadbeef<" in text_cell and "bin" not in text_cell
    assert ">hex:deadbeef<" in binary_cell and 'class="filter bin"' in binary_cell
    assert "?key=text%3A0xdeadbeef" in text_cell
    assert "?key=hex%3Adeadbeef" in binary_cell
    # each link's filter asks the server for exactly that key
    client = console(broker)
    client.get("/streams/orders/messages?key=text%3A0xdeadbeef")
    client.get("/streams/orders/messages?key=hex%3Adeadbeef")
    client.get("/streams/orders/messages?key=0xdeadbeef")  # an old link: still hex
    assert [b.get("key") for b in broker.browsed[1:]] == [
        b"0xdeadbeef",
        b"\xde\xad\xbe\xef",
        b"\xde\xad\xbe\xef",
    ]


def test_several_headers_are_all_sent_and_the_form_keeps_them_with_a_box_to_spare() -> None:
    broker = FakeBroker()
    answer = console(broker).get("/streams/orders/messages?header=type%3Dodd&header=region%3Deu")
    assert broker.browsed[-1]["headers"] == {"type": b"odd", "region": b"eu"}
    boxes = re.findall(r'<input name="header" value="([^"]*)"', answer.body)
    assert boxes == ["type=odd", "region=eu", ""]
    assert 'placeholder="e.g. 2026-11-25T10:00"' in answer.body  # an example, not a value
    older = re.search(r'id="export-csv" href="([^"]+)"', answer.body)
    assert older and "header=type%3Dodd&amp;header=region%3Deu" in older.group(1)


# -- a view's count --------------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["abc", "-5", "0", "1001"])
def test_a_bad_count_is_a_400_naming_the_field(count: str) -> None:
    broker = FakeBroker()
    answer = console(broker).get(f"/views/orders/per-minute?key=k1&count={quote(count)}")
    assert answer.status == 400
    assert "count:" in text_of(answer) and "Something went wrong" not in answer.body
    assert broker.values_asked == []


def test_a_good_count_is_asked_for() -> None:
    broker = FakeBroker()
    assert console(broker).get("/views/orders/per-minute?key=k1&count=7").status == 200
    assert console(broker).get("/views/orders/per-minute?key=k1").status == 200
    assert broker.values_asked == [7, 10]


# -- consumer groups -------------------------------------------------------------------------------


def test_each_group_shows_its_lag_summed_and_its_worst_member() -> None:
    orders = StreamInfo(
        "orders",
        "orders",
        T0,
        tuple(PartitionInfo(p, n, n, False, False, "") for p, n in enumerate((100, 50, 9))),
    )
    group = GroupInfo(
        "billing",
        3,
        (GroupMemberInfo("c1", ("orders",), 1.0), GroupMemberInfo("c2", ("orders",), 2.0)),
        {"c1": {"orders": (0, 1)}, "c2": {"orders": (2,)}},
    )
    broker = FakeBroker(streams=[orders], groups=[group])
    client = console(broker)
    sampler = client.app.state.console.sampler
    sampler.cursors.update(
        {
            CursorKey("__group:billing", "orders", 0): 90,  # lag 10
            CursorKey("__group:billing", "orders", 1): 20,  # lag 30
            # partition 2: no committed position yet
        }
    )
    answer = client.get("/consumers")
    groups = table(answer, "groups")
    assert re.search(r'class="n group-lag"[^>]*>40 <span[^>]*>\+1 unknown', groups)
    assert re.search(r'class="n worst"[^>]*><span class="mono">c1</span>: 40<', groups)


def test_a_group_known_only_by_its_positions_is_listed_with_its_lag() -> None:
    orders = StreamInfo(
        "orders",
        "orders",
        T0,
        tuple(PartitionInfo(p, n, n, False, False, "") for p, n in enumerate((100, 50))),
    )
    member = GroupMemberInfo("c1", ("orders",), 1.0)
    tidelog_group = GroupInfo("billing", 1, (member,), {"c1": {"orders": (0, 1)}})
    client = console(FakeBroker(streams=[orders], groups=[tidelog_group]))
    client.app.state.console.sampler.cursors.update(
        {
            # Kafka committed 90 (stored 89) of offsets 0..100: 11 behind, as Kafka counts
            CursorKey("__group:kafka-readers", "orders", 0): 89,
            CursorKey("__group:kafka-readers", "orders", 1): -1,  # committed 0: all 51 behind
            CursorKey("__group:billing", "orders", 0): 100,  # a tidelog group: shown above
            CursorKey("plain-cursor", "orders", 0): 3,
        }
    )
    listed = table(client.get("/consumers"), "position-groups")
    assert "kafka-readers" in listed and "billing" not in listed and "plain" not in listed
    assert re.search(r'class="n group-lag">62<', listed)


# -- the cluster -----------------------------------------------------------------------------------


def status(*brokers: ClusterBroker) -> ClusterStatus:
    partition = PartitionReplicas(
        "orders", 0, "b1", 1, ("b1", "b2"), ("b1", "b2"), (), 1, 9, 10,
        (ReplicaProgress("b2", 10, True),),
    )  # fmt: skip
    return ClusterStatus("c", "b1", brokers, (partition,))


def test_a_stopped_broker_stays_on_the_cluster_page_as_down_and_offsets_share_one_convention() -> (
    None
):
    three = status(
        ClusterBroker("b1", "127.0.0.1:1", True),
        ClusterBroker("b2", "127.0.0.1:2", False),
        ClusterBroker("b3", "127.0.0.1:3", False),
    )
    two = status(
        ClusterBroker("b1", "127.0.0.1:1", True), ClusterBroker("b2", "127.0.0.1:2", False)
    )
    client = console(FakeBroker(cluster=[three, two]))
    assert table(client.get("/cluster"), "brokers").count("<tr") == 4
    brokers = table(client.get("/cluster"), "brokers")
    assert brokers.count("<tr") == 4
    b3 = re.search(r"<tr[^>]*><td class=\"mono\">b3</td>.*?</tr>", brokers, re.S)
    assert b3 and "down" in b3.group(0) and "127.0.0.1:3" in b3.group(0)
    assert "last seen" in b3.group(0)
    partitions = table(client.get("/cluster"), "partitions")
    # high watermark 9 and log end 10 are one record: both shown as that record's offset
    numbers = re.findall(r'<td class="n">(\d+)</td>', partitions)
    assert numbers[-2:] == ["9", "9"]


def test_a_single_broker_shows_no_leadership_and_no_subject_equal_to_the_name() -> None:
    client = console(FakeBroker(streams=[info("orders", 2), info("clicks")]))
    stream = client.get("/streams/orders")
    assert stream.status == 200
    assert "0c1e76d262b277c0" not in stream.body and "leader" not in text_of(stream)
    assert "subject" not in text_of(stream)
    assert "in since start" in text_of(stream) and "after retention" in text_of(stream)
    streams = client.get("/streams")
    assert "Subject" not in streams.body
    clustered = console(
        FakeBroker(
            streams=[info("orders"), info("clicks", subject="ui.clicks")],
            cluster=[status(ClusterBroker("b1", "a", True))],
        )
    )
    assert "ui.clicks" in table(clustered.get("/streams"), "streams")
    assert "0c1e76d262b277c0" in clustered.get("/streams/orders").body  # its leader, in a cluster


# -- replication and errors ------------------------------------------------------------------------


def test_replication_says_what_to_do_about_a_failure_and_links_docs_that_exist() -> None:
    failing = SiteStatus(
        "west", "10.0.0.9:9292", "error", 0, 3, 1.0, None, False, True,
        "UNAUTHENTICATED: Received http2 header with status: 401",
    )  # fmt: skip
    answer = console(FakeBroker(sites=[failing])).get("/replication")
    shown = text_of(answer)
    assert "did not accept this server's credentials" in shown and "10.0.0.9:9292" in shown
    assert "<details" in answer.body  # the raw reason stays, folded away
    off = console(FakeBroker())
    off.app.state.console._client.site_status = _not_a_site
    assert "docs/replication.md" in off.get("/replication").body
    assert "docs/sites.md" not in off.get("/replication").body


async def _not_a_site() -> list[SiteStatus]:
    raise FailedPrecondition("this server is not a site")


def test_a_method_not_allowed_is_titled_so() -> None:
    answer = console(FakeBroker()).post("/streams", "")
    assert answer.status == 405
    assert "<title>Method not allowed" in answer.body and "Not found" not in answer.body
