"""The messages page continues from a row by its position, never by its time: Chromium (Debian's,
as ``test_console_browser.py``) against a ``tidelog serve`` holding whole batches that share one
timestamp each (``publish_batch``), where a continuation by time repeats, skips or spins.

- the live tail after a batch of 1,000 shows every new row at once, and polls at its pace (about
  6 polls in 3 s, counted on its event stream) instead of spinning;
- the tail of an empty filtered page starts at the live end (no old message shown as new);
- a jump to an offset inside a batch shows that row first, highlighted;
- "Newer" after "Older" inside a batch shows the rows above, and its export holds exactly them;
- a search for a rare key far back, once continued from the live page, goes on by itself until
  it finds it;
- a tail whose server went away says so and goes on when it is back (a standalone console);
- a tail the console keeps refusing backs off and stops, saying what to do;
- a tail past ``until`` shows its rows once and says it ended (no reconnect).
"""

from __future__ import annotations

import csv
import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect
from tests.console.browsertools import Console, free_port
from tests.support.server import ServerProcess, served

from tidelog.client import Client

pytestmark = pytest.mark.slow

BATCH = 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, str]]:
    """The server and its console's URL. ``batched``: 3 partitions, one batch of 1,000 each
    (partition 0, then 1, then 2: three timestamps)."""
    http_port = free_port()
    data = tmp_path_factory.mktemp("positions") / "data"
    with served(data, "--metrics-port", str(http_port)) as process:
        with Client(process.address) as client:
            client.create_stream("batched", partitions=3)
            for partition in range(3):
                values = [b"p%d-%d" % (partition, i) for i in range(BATCH)]
                client.publish_batch("batched", values, partition=partition)
        yield process, f"http://127.0.0.1:{http_port}"


def shown(page: Page) -> list[tuple[int, int]]:
    """(partition, offset) of every row shown."""
    return [
        (int(cells[1]), int(cells[2]))
        for cells in (r.locator("td").all_inner_texts() for r in page.locator("#rows tr").all())
    ]


def top_offset_is(page: Page, offset: int) -> None:
    """Wait until the first row shown is ``offset`` (a boosted link swaps the page later)."""
    expect(page.locator("#rows tr").first.locator("td").nth(2)).to_have_text(str(offset))


def tail_events(url: str, seconds: float) -> int:
    """Events (rows or idle polls) a tail of ``url`` sends in ``seconds``: one per poll."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=seconds + 5)
    try:
        connection.request("GET", f"{parts.path}?{parts.query}", headers={"Host": parts.netloc})
        response = connection.getresponse()
        assert response.status == 200, response.read()[:500]
        events = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = response.readline()
            if not line:
                break
            if line.startswith((b": idle", b"id:")):  # every event of a poll has an id
                events += 1
        return events
    finally:
        connection.close()


def test_the_tail_after_a_batch_of_1000_shows_it_all_and_polls_at_its_pace(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("tailed", partitions=2)
        client.publish_batch("tailed", [b"old-%d" % i for i in range(BATCH)], partition=0)
        page.goto(f"{url}/streams/tailed/messages")
        top = page.locator("#rows tr").first.get_attribute("data-pos")
        page.click("#tail")
        expect(page.locator("#tail-status")).to_contain_text("following")
        client.publish_batch("tailed", [b"new-%d" % i for i in range(BATCH)], partition=1)
    # A tail from the page's top row after the batch: the backlog of 1,000 in 5 polls, then a
    # poll every 0.5 s; a tail spinning on the shared timestamp sends hundreds of idle polls.
    events = tail_events(f"{url}/streams/tailed/tail?after={top}", 3.0)
    assert 5 <= events <= 25, events
    expect(page.locator("#rows tr").first).to_contain_text("new-999", timeout=3_000)
    expect(page.locator("#rows tr td.value", has_text="new-")).to_have_count(BATCH)


def test_the_tail_of_an_empty_filtered_page_starts_at_the_live_end(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("sparse")
        client.publish("sparse", b"an old needle", key=b"needle")
        client.publish_batch("sparse", [b"hay-%d" % i for i in range(120_000)])
        page.clock.install(time=0)  # the search would go on by itself; it waits for the clock here
        page.clock.pause_at(1_000)
        page.goto(f"{url}/streams/sparse/messages?key=needle")
        expect(page.locator("#empty")).to_be_visible()
        page.click("#tail")
        expect(page.locator("#tail-status")).to_contain_text("following")
        page.wait_for_timeout(1_500)  # real time: several polls of the tail
        assert page.locator("#rows tr").count() == 0
        client.publish("sparse", b"a new needle", key=b"needle")
    expect(page.locator("#rows tr").first).to_contain_text("a new needle", timeout=5_000)
    expect(page.locator("#rows tr")).to_have_count(1)


def test_a_jump_to_an_offset_inside_a_batch_lands_on_that_row(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.goto(f"{url}/streams/batched/messages?partition=1&offset=456&limit=10")
    assert shown(page) == [(1, o) for o in range(456, 446, -1)]
    focus = page.locator("#rows tr.focus")
    expect(focus).to_have_count(1)
    expect(focus.locator("td").nth(2)).to_have_text("456")
    page.click("#newer")
    top_offset_is(page, 466)
    assert shown(page) == [(1, o) for o in range(466, 456, -1)]


def test_newer_after_older_inside_a_batch_and_its_export(
    server: tuple[ServerProcess, str], page: Page, tmp_path: Path
) -> None:
    _, url = server
    page.goto(f"{url}/streams/batched/messages?limit=50")
    first = shown(page)
    assert first == [(2, o) for o in range(999, 949, -1)]
    page.click("#older")
    top_offset_is(page, 949)
    assert shown(page) == [(2, o) for o in range(949, 899, -1)]
    page.click("#newer")
    top_offset_is(page, 999)
    assert shown(page) == first
    with page.expect_download() as download:
        page.click("#export-csv")
    path = tmp_path / "newer.csv"
    download.value.save_as(path)
    with path.open(newline="") as f:
        exported = [(int(r["partition"]), int(r["offset"])) for r in csv.DictReader(f)]
    assert exported == first


def test_a_search_goes_on_by_itself_until_it_finds_a_rare_key_far_back(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    process, url = server
    with Client(process.address) as client:
        client.create_stream("haystack", partitions=2)
        client.publish("haystack", b"found me", key=b"rare", partition=1)
        for partition in (0, 1):
            for _ in range(3):
                client.publish_batch("haystack", [b"h"] * 50_000, partition=partition)
    page.goto(f"{url}/streams/haystack/messages?key=rare")
    page.click("#continue-search")  # a live page only offers it (going on would end a tail)
    expect(page.locator("#rows tr").first).to_contain_text("found me", timeout=20_000)
    expect(page.locator("#rows tr")).to_have_count(1)
    expect(page.locator(".pager")).to_contain_text("scanned 300,001")


def test_the_tail_says_it_reconnects_and_goes_on_when_the_server_is_back(
    tmp_path: Path, page: Page
) -> None:
    port = free_port()
    process = ServerProcess(tmp_path / "data", "--port", str(port)).start()
    console: Console | None = None
    try:
        with Client(process.address) as client:
            client.create_stream("flaky")
            client.publish("flaky", b"before")
        console = Console(process.address)
        page.goto(f"{console.url}/streams/flaky/messages")
        page.click("#tail")
        expect(page.locator("#tail-status")).to_contain_text("following")
        process.kill()
        expect(page.locator("#tail-status")).to_contain_text("reconnecting", timeout=15_000)
        assert "StatusCode" not in page.locator("#tail-status").inner_text()
        _wait_free(port)
        process.start()
        with Client(process.address) as client:
            client.publish_batch("flaky", [b"after-%d" % i for i in range(300)])
        expect(page.locator("#rows tr").first).to_contain_text("after-299", timeout=20_000)
        expect(page.locator("#tail-status")).to_contain_text("following")
        expect(page.locator("#rows tr")).to_have_count(301)
    finally:
        if console is not None:
            console.kill()
        process.kill()


def test_a_tail_the_console_keeps_refusing_backs_off_and_stops_saying_what_to_do(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    """An error page (here a 403, as for an access withdrawn) does not mend itself: the tail
    waits longer after each refusal and gives up after a few, instead of every 2 s forever."""
    _, url = server
    page.clock.install(time=0)
    page.goto(f"{url}/streams/batched/messages")
    refused: list[float] = []

    def refuse(route: Route) -> None:
        refused.append(time.monotonic())
        route.fulfill(status=403, content_type="text/html", body="<p>Refused</p>")

    page.route("**/tail?**", refuse)
    page.click("#tail")
    expect(page.locator("#tail-status")).to_contain_text("reconnecting")
    for _ in range(20):  # 20 times 15 s of the page's clock: 150 tries at one every 2 s
        page.clock.run_for(15_000)
    expect(page.locator("#tail-status")).to_contain_text("tail stopped")
    expect(page.locator("#tail-status")).to_contain_text("Reload the page")
    expect(page.locator("#tail")).to_have_text("▶ Live tail")
    assert len(refused) == 6


def test_a_tail_past_until_shows_its_rows_once_and_says_it_ended(
    server: tuple[ServerProcess, str], page: Page
) -> None:
    _, url = server
    page.clock.install(time=0)
    page.goto(f"{url}/streams/batched/messages?until=2000-01-01&limit=5")
    opened: list[str] = []
    page.on("request", lambda r: opened.append(r.url) if "/tail?" in r.url else None)
    page.click("#tail")
    expect(page.locator("#tail-status")).to_contain_text("tail ended")
    for _ in range(10):
        page.clock.run_for(10_000)
    assert len(opened) == 1
    expect(page.locator("#tail")).to_have_text("▶ Live tail")


def _wait_free(port: int) -> None:
    """Until ``port`` can be bound again (the killed server's socket is gone)."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(0.1)
    raise AssertionError(f"port {port} stayed busy")
