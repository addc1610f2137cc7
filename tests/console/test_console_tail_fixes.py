"""The live tail's and the messages page's edges, request by request against the in-memory broker
of ``test_console_display.py``: a tail that ends says so once (no stale id to reconnect with, a
204 when asked again from a finished cursor), positions and times out of range are a 400 naming
the field, a client's cursor must look like the server's tokens."""

from __future__ import annotations

from typing import Any

from tests.console.test_console_display import FakeBroker, console, message

from tidelog.client import BrowsePage


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

