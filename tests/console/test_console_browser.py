"""The console in a real headless Chromium (Debian's, `make chromium`) against a real
``tidelog serve`` holding known data: what a person sees on each page.

One server (a site, with a remote site declared, so the replication page has a row) serves the
console beside /metrics; one standalone ``tidelog console`` samples every 0.3 s and calls a cursor
stalled after 1.5 s, so the consumers page can show a stalled consumer within the test. Each page
is saved as a screenshot under docs/console/. Thirty messages go to three partitions round-robin,
one at a time, so that their timestamps interleave the partitions: message n (value ``{"n": n}``,
key ``k{n % 4}``) is on partition ``n % 3``, and newest first the partitions read 2, 1, 0, 2, ...
"""

from __future__ import annotations

import csv
import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from playwright.sync_api import Browser, Page, expect
from tests.console.browsertools import Console, free_port, shot
from tests.support.server import ServerProcess, served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.client import Client, View

pytestmark = pytest.mark.slow

MESSAGES = 30
PARTITIONS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """The server and the base URL of the console it serves."""
    http_port = free_port()
    data = tmp_path_factory.mktemp("console") / "data"
    with served(data, "--site-id", "east", "--metrics-port", str(http_port)) as process:
        with Client(process.address) as client:
            client.create_stream("orders", partitions=PARTITIONS, retention_messages=100_000)
            for n in range(MESSAGES):
                client.publish(
                    "orders",
                    json.dumps({"n": n, "item": f"widget-{n}"}).encode(),
                    key=b"k%d" % (n % 4),
                    headers={"type": b"even" if n % 2 == 0 else b"odd"},
                    partition=n % PARTITIONS,
                )
            client.publish("orders", b"x" * 100_000, key=b"big", partition=0)
            client.create_stream("clicks", partitions=2)
            client.create_stream("payments")
            client.publish("payments", b"\x00\x01binary\xff", key=b"p1")
            client.set_cursor("billing", "orders", 0, 3)
            client.set_cursor("audit", "orders", 1, 9)
            client.declare_view("orders", View.table("latest"))
            client.declare_view("orders", View.window("per-minute", 60_000))
            with socket.socket() as probe:  # an address where no site listens
                probe.bind(("127.0.0.1", 0))
                client.add_site("west", f"127.0.0.1:{probe.getsockname()[1]}")
            client.transmit_many("orders-to-west", [(b"%d" % i, ["west"]) for i in range(3)])
        yield process, f"http://127.0.0.1:{http_port}"


def rows(page: Page) -> list[list[str]]:
    return [
        [c.strip() for c in r.locator("td").all_inner_texts()]
        for r in page.locator("#rows tr").all()
    ]


# -- pages ---------------------------------------------------------------------------------------


def test_the_streams_page_lists_streams_with_their_partitions_and_messages(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    page.goto(f"{url}/")
    expect(page).to_have_url(f"{url}/streams")
    orders = page.locator("#streams tr", has_text="orders")
    expect(orders).to_contain_text(str(PARTITIONS))
    expect(orders).to_contain_text(str(MESSAGES + 1))  # appended: 30 + the large one
    expect(page.locator("#streams")).not_to_contain_text("__cursors")  # internal: hidden
    # the console samples on each visit: clicks published between visits draw a rate
    with Client(process.address) as client:
        for burst in (40, 90, 60, 120):
            client.publish_batch("clicks", [b"click"] * burst, partition=burst % 2)
            time.sleep(0.2)
            page.reload()
    expect(page.locator("#streams tr", has_text="clicks")).to_contain_text("310")
    assert page.locator("#streams tr", has_text="clicks").locator("polyline").count() == 1
    shot(page, "streams")
    page.click("text=orders")
    expect(page.locator("h1")).to_contain_text("orders")
    expect(page.locator("#partitions tbody tr")).to_have_count(PARTITIONS)
    held = page.locator("#partitions tbody tr").first.locator("td")
    expect(held.nth(3)).to_have_text("11")  # partition 0: ten messages and the large one
    expect(held.nth(4)).to_contain_text("KiB")
    expect(page.locator("#settings")).to_contain_text("7 d · 100,000 messages per partition")
    expect(page.locator("#settings")).to_contain_text("Compaction")
    shot(page, "stream")


def test_messages_are_newest_first_merged_across_partitions(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/streams/orders/messages?limit=10")
    shown = rows(page)
    assert len(shown) == 10
    # newest on top: the large value published last, then message 29, 28, ... interleaved
    assert shown[0][3] == "big"
    values = [json.loads(r[5])["n"] for r in shown[1:]]
    assert values == list(range(MESSAGES - 1, MESSAGES - 10, -1))
    assert [int(r[1]) for r in shown[1:]] == [n % PARTITIONS for n in values]
    assert shown[0][0] >= shown[1][0] >= shown[-1][0]  # times, newest first
    assert "see all" in page.locator("#rows tr").first.inner_html()  # the big value is cut
    shot(page, "messages")
    # the next page continues where this one ended
    page.click("#older")
    expect(page.locator("#rows tr").first).to_contain_text("widget-20")  # the new page is in
    assert [json.loads(r[5])["n"] for r in rows(page)] == list(range(20, 10, -1))
    # and newer comes back to the ten above it, newest first
    page.click("#newer")
    expect(page.locator("#rows tr").first).to_contain_text("big")
    assert [json.loads(r[5])["n"] for r in rows(page)[1:]] == values


def test_jump_to_an_offset_or_a_time(server: tuple[ServerProcess, str], page: Page) -> None:
    _, url = server
    page.goto(f"{url}/streams/orders/messages")
    page.fill("input[name=partition]", "1")
    page.fill("input[name=offset]", "4")  # partition 1, offset 4: message 13
    page.click("button:has-text('Show')")
    focus = page.locator("#rows tr.focus")
    expect(focus).to_contain_text("widget-13")
    assert [r[1] for r in rows(page)] == ["1"] * len(rows(page))  # that partition only
    assert json.loads(rows(page)[0][5])["n"] == 13  # nothing newer than it on top
    time_of_13 = focus.locator("td").first.inner_text()
    page.goto(f"{url}/streams/orders/messages?at={time_of_13}&limit=3")
    # at or before that millisecond: 13 and the two before it, or any later in the same ms
    assert 13 in [json.loads(r[5])["n"] for r in rows(page)]
    page.goto(f"{url}/streams/orders/messages?offset=99&partition=0")
    expect(page.locator(".problem")).to_contain_text("no message at offset 99")


def test_a_filter_narrows_the_list(server: tuple[ServerProcess, str], page: Page) -> None:
    _, url = server
    page.goto(f"{url}/streams/orders/messages")
    page.fill("input[name=key]", "k1")
    page.locator("input[name=header]").first.fill("type=odd")
    page.click("button:has-text('Show')")
    # only the fields filled in travel in the URL
    expect(page).to_have_url(re.compile(r"[?&]key=k1(&|$)"))
    assert "key_prefix=" not in page.url and "contains=" not in page.url
    assert page.url.count("header=") == 1
    expect(page.locator("#rows tr").first).to_contain_text("k1")
    shown = rows(page)
    expected = [n for n in range(MESSAGES - 1, -1, -1) if n % 4 == 1]
    assert [json.loads(r[5])["n"] for r in shown] == expected
    assert all(r[3] == "k1" and "type=odd" in r[4] for r in shown)
    page.fill("input[name=key]", "")
    page.locator("input[name=header]").first.fill("")
    page.fill("input[name=contains]", "widget-17")
    page.click("button:has-text('Show')")
    expect(page.locator("#rows tr")).to_have_count(1)
    shot(page, "messages-filtered")


def test_live_tail_shows_a_message_published_after_the_page_opened(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    page.goto(f"{url}/streams/payments/messages")
    expect(page.locator("#rows tr")).to_have_count(1)
    page.click("#tail")
    expect(page.locator("#tail-status")).to_contain_text("following")
    with Client(process.address) as client:
        client.publish("payments", b'{"amount": 42}', key=b"live-one")
    expect(page.locator("#rows tr").first).to_contain_text("live-one", timeout=10_000)
    expect(page.locator("#rows tr")).to_have_count(2)


def test_export_downloads_the_rows_of_the_page(
    server: tuple[ServerProcess, str], page: Page, tmp_path: Path
) -> None:
    _, url = server
    page.goto(f"{url}/streams/orders/messages?limit=7&key_prefix=k")
    shown = rows(page)
    assert len(shown) == 7
    with page.expect_download() as csv_download:
        page.click("#export-csv")
    path = tmp_path / "page.csv"
    csv_download.value.save_as(path)
    with path.open(newline="") as f:
        exported = list(csv.DictReader(f))
    assert [(int(e["partition"]), int(e["offset"])) for e in exported] == [
        (int(r[1]), int(r[2])) for r in shown
    ]
    with page.expect_download() as jsonl_download:
        page.click("#export-jsonl")
    jsonl = tmp_path / "page.jsonl"
    jsonl_download.value.save_as(jsonl)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [r["value"] for r in records] == [r[5] for r in shown]
    assert csv_download.value.suggested_filename == "orders-messages.csv"


def test_a_message_shows_json_utf8_and_hex_and_a_large_value_can_be_seen_whole(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/streams/orders/messages/2/9")  # message 29
    expect(page.locator("#tab-json")).to_contain_text('"item": "widget-29"')
    expect(page.locator("table.grid")).to_contain_text("odd")  # the header type=odd
    page.click("button[data-tab=hex]")
    expect(page.locator("#tab-hex")).to_contain_text("7b 22 6e 22")
    page.click("button[data-tab=json]")
    shot(page, "message")
    page.goto(f"{url}/streams/orders/messages/0/10")  # the 100,000-byte value
    expect(page.locator(".notice")).to_contain_text("Showing the first 64.0 KiB")
    assert len(page.locator("#tab-text").inner_text()) == 64 * 1024
    page.click("#show-all")
    expect(page.locator(".notice")).to_have_count(0)
    assert len(page.locator("#tab-text").inner_text()) == 100_000
    page.goto(f"{url}/streams/payments/messages/0/0")
    page.click("button[data-tab=hex]")
    expect(page.locator("#tab-hex")).to_contain_text("00 01 62 69 6e")


def test_views_list_get_a_key_and_last_values(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/views")
    expect(page.locator("#views tbody tr")).to_have_count(2)
    shot(page, "views")
    page.click("text=latest")
    page.fill("input[name=key]", "k2")
    page.click("button:has-text('Get')")
    expect(page.locator("#entries tbody tr")).to_have_count(1)
    expect(page.locator("#entries")).to_contain_text('"n": 26')
    page.goto(f"{url}/views/orders/per-minute?key=k3&count=3")
    texts = page.locator("#entries tbody tr").all_inner_texts()
    assert len(texts) == 3 and '"n": 27' in texts[0] and '"n": 23' in texts[1]
    shot(page, "view")


def test_replication_shows_each_site_with_its_state_and_outstanding_entries(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/replication")
    west = page.locator("#sites tr", has_text="west")
    expect(west).to_contain_text("3")
    expect(west).to_contain_text("stalled", timeout=15_000)
    shot(page, "replication")
    page.click("text=cluster page")
    expect(page.locator("#single")).to_contain_text("single broker")


def test_consumers_show_lag_and_a_stalled_cursor_standalone(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    """``tidelog console`` on its own port: lag per partition, and a cursor that does not move
    while it has lag shown as stalled after --stall-after."""
    process, _ = server
    with grpc.insecure_channel(process.address) as channel:
        api = pb_grpc.APIStub(channel)
        for consumer in ("packer-1", "packer-2"):
            api.JoinConsumerGroup(
                pb.JoinConsumerGroupRequest(
                    groupId="shipping", consumerId=consumer, streams=["orders"]
                )
            )
    console = Console(process.address, "--sample-interval", "0.3", "--stall-after", "1.5")
    try:
        page.goto(f"{console.url}/consumers")
        billing = page.locator("#cursors tr", has_text="billing")
        expect(billing.locator("td").nth(5)).to_have_text("7")  # newest offset 10 - cursor 3
        deadline = time.monotonic() + 10
        while "stalled" not in billing.inner_text() and time.monotonic() < deadline:
            time.sleep(0.5)
            page.reload()
        expect(billing.locator(".tag")).to_have_text("stalled")
        expect(page.locator("#cursors tr", has_text="audit").locator(".tag")).to_have_text(
            "caught up"
        )
        expect(page.locator("#groups tbody tr")).to_have_count(2)
        expect(page.locator("#groups")).to_contain_text("shipping")
        assigned = page.locator("#groups tbody tr td.mono", has_text="orders:").all_inner_texts()
        partitions = sorted(int(p) for t in assigned for p in t.split(":")[1].split(","))
        assert partitions == list(range(PARTITIONS))
        page.wait_for_selector(".chart .uplot")
        shot(page, "consumers")
    finally:
        console.kill()


def test_admin_actions_ask_for_confirmation_first(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    page.goto(f"{url}/streams")
    page.fill("input[name=stream]", "scratch")
    page.fill("input[name=partition_count]", "2")
    page.click("button:has-text('Create…')")
    expect(page.locator(".confirm")).to_contain_text("Create stream 'scratch' with 2 partition(s)")
    with Client(process.address) as client:
        assert "scratch" not in [s.name for s in client.list_streams()]
    page.click("button:has-text('Yes')")
    expect(page.locator("#partitions tbody tr")).to_have_count(2)
    page.locator("form[action='/actions/readonly'] button").click()
    page.click("button:has-text('Yes')")
    expect(page.locator("#partitions")).to_contain_text("read-only")
    page.locator("form[action='/actions/delete'] button").click()
    expect(page.locator(".confirm")).to_contain_text("cannot be undone")
    shot(page, "confirm")
    page.click("button:has-text('Yes')")
    expect(page).to_have_url(f"{url}/streams")
    with Client(process.address) as client:
        assert "scratch" not in [s.name for s in client.list_streams()]


def test_errors_say_what_to_do_and_never_show_a_traceback(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/streams/no-such-stream/messages")
    expect(page.locator(".problem")).to_contain_text("no-such-stream")
    page.goto(f"{url}/streams/orders/messages?since=yesterday")
    expect(page.locator(".problem")).to_contain_text("is not a time")
    dead = Console(f"127.0.0.1:{free_port()}")
    try:
        started = time.monotonic()
        page.goto(f"{dead.url}/streams")
        expect(page.locator(".problem h1")).to_have_text("The tidelog server cannot be reached")
        assert time.monotonic() - started < 8
        shot(page, "unreachable")
    finally:
        dead.kill()
    assert "Traceback" not in page.content()


def test_a_search_that_hits_its_budget_says_how_far_it_got(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    """A search for a key no message has, in a stream larger than the page's scan budget."""
    process, url = server
    with Client(process.address) as client:
        client.create_stream("many")
        client.publish_batch("many", [b"%d" % i for i in range(120_000)])
    page.clock.install(time=0)  # the search waits here until the clock runs: it can be stopped
    page.clock.pause_at(1_000)
    page.goto(f"{url}/streams/many/messages?key=absent")
    expect(page.locator("#budget")).to_contain_text("has scanned 100,000 messages, back to")
    expect(page.locator("#budget a")).to_contain_text("Continue searching older")
    expect(page.locator("#search-going")).to_have_count(0)  # the live page does not go on
    expect(page.locator("#budget")).to_contain_text("it then goes on by itself")
    jumped = f"{url}/streams/many/messages?key=absent&at=2100-01-01"  # not live: it goes on
    page.goto(jumped)
    expect(page.locator("#search-going")).to_contain_text("up to 10,000,000 messages")
    page.click("#stop-search")
    page.clock.run_for(5_000)
    expect(page.locator("#search-going")).to_have_text("Stopped.")
    assert "token=" not in page.url
    page.goto(jumped)  # not stopped: it goes on by itself
    page.clock.run_for(5_000)
    expect(page.locator("#empty")).to_have_text("No message matches these filters.")
    expect(page.locator(".pager")).to_contain_text("scanned 120,000")


def test_a_search_waits_while_its_tab_is_hidden(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("unseen")
        client.publish_batch("unseen", [b"%d" % i for i in range(120_000)])
    page.add_init_script(  # the tab is hidden (as a tab in the background is)
        "window.hiddenTab = true; Object.defineProperty(document, 'hidden', "
        "{configurable: true, get: function () { return window.hiddenTab; }});"
    )
    page.goto(f"{url}/streams/unseen/messages?key=absent&at=2100-01-01")
    expect(page.locator("#search-going")).to_contain_text("pausing while this tab is hidden")
    page.wait_for_timeout(1_500)  # real time: the step was due after 0.2 s
    assert "token=" not in page.url
    page.evaluate("window.hiddenTab = false; document.dispatchEvent(new Event('visibilitychange'))")
    expect(page.locator(".pager")).to_contain_text("scanned 120,000")


# -- what the pages show ---------------------------------------------------------------------------


def test_a_huge_key_or_header_value_does_not_widen_the_page(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("wide")
        client.publish("wide", b"v", key=b"k" * 100_000, headers={"trace": b"h" * 100_000})
    width = "document.documentElement.scrollWidth"
    page.goto(f"{url}/streams/wide/messages")
    expect(page.locator("#rows tr")).to_have_count(1)
    assert page.evaluate(width) <= 1280
    page.locator("#rows a[title='see the whole key']").click()
    expect(page.locator("#key")).to_be_visible()
    assert page.evaluate(width) <= 1280
    assert len(page.locator("#key").inner_text()) == 100_000  # whole, wrapped and scrolled


def test_a_text_key_that_reads_like_hex_is_found_apart_from_the_binary_one(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("keys")
        client.publish("keys", b"binary", key=bytes.fromhex("deadbeef"))
        client.publish("keys", b"text", key=b"0xdeadbeef")
    page.goto(f"{url}/streams/keys/messages")
    keys = page.locator("#rows td.key")
    expect(keys).to_have_text(["0xdeadbeef", "hex:deadbeef"])
    keys.first.locator("a").click()  # the text key: its filter finds it, and only it
    expect(page.locator("#rows tr")).to_have_count(1)
    expect(page.locator("#rows tr")).to_contain_text("text")
    page.goto(f"{url}/streams/keys/messages")
    page.locator("#rows td.key").nth(1).locator("a").click()
    expect(page.locator("#rows tr")).to_have_count(1)
    expect(page.locator("#rows tr")).to_contain_text("binary")
    page.goto(f"{url}/streams/keys/messages?key=0xdeadbeef")  # an old link: hex, as before
    expect(page.locator("#rows tr")).to_have_count(1)
    expect(page.locator("#rows tr")).to_contain_text("binary")


def test_charts_read_in_utc_on_a_24_hour_clock(
    server: tuple[ServerProcess, str], browser: Browser
) -> None:
    """A browser in Los Angeles sees the rate chart's times in UTC, as the tables show them."""
    process, url = server
    context = browser.new_context(
        viewport={"width": 1280, "height": 800}, timezone_id="America/Los_Angeles"
    )
    try:
        page = context.new_page()
        with Client(process.address) as client:
            client.create_stream("charted")
            for _ in range(3):  # the stream page samples at each visit: three points
                client.publish("charted", b"x")
                page.goto(f"{url}/streams/charted")
                time.sleep(0.3)
        page.wait_for_selector(".chart .uplot")
        page.locator(".chart .u-over").hover()
        shown = page.locator(".u-legend .u-series").first.locator(".u-value").inner_text()
        match = re.fullmatch(r"\d{4}-\d\d-\d\d (\d\d):\d\d:\d\d UTC", shown)
        assert match, shown
        assert int(match.group(1)) in {time.gmtime().tm_hour, (time.gmtime().tm_hour - 1) % 24}
    finally:
        context.close()
