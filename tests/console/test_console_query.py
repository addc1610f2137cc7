"""The messages page's query string: every field checked, turned into browse filters (data, never
code), and written back into links."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tidelog.console.query import (
    CONTINUED_MAX_SCAN,
    DEFAULT_MAX_SCAN,
    BadQuery,
    MessageQuery,
)


def test_filters_become_browse_arguments_with_a_scan_budget() -> None:
    query = MessageQuery.parse(
        {
            "key": "0x00ff",
            "key_prefix": "user-",
            "header": "type = odd",
            "contains": "widget",
            "since": "2026-11-25T10:00:00",
            "until": "2026-11-25T12:00:00+01:00",
            "partition": "0, 2",
            "ignored": "x",
        }
    )
    args = query.browse_filters()
    assert args["key"] == b"\x00\xff" and args["key_prefix"] == b"user-"
    assert args["headers"] == {"type": b" odd"}
    assert args["contains"] == b"widget"
    assert args["since"] == datetime(2026, 11, 25, 10, tzinfo=UTC)
    assert args["until"].utcoffset().total_seconds() == 3600
    assert args["partitions"] == [0, 2]
    assert args["max_scan"] == DEFAULT_MAX_SCAN
    assert "max_scan" not in MessageQuery.parse({}).browse_filters()  # no filter, no budget


@pytest.mark.parametrize(
    ("params", "says"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"order": "sideways"}, "order"),
        ({"since": "yesterday"}, "since"),
        ({"header": "novalue"}, "name=value"),
        ({"key": "0xzz"}, "not hex"),
        ({"offset": "5"}, "exactly one partition"),
        ({"offset": "-1", "partition": "0"}, "offset"),
        ({"partition": "a"}, "partition"),
        ({"searched": "-3"}, "searched"),
    ],
)
def test_a_bad_field_is_named(params: dict[str, str], says: str) -> None:
    with pytest.raises(BadQuery, match=says):
        MessageQuery.parse(params)


def test_links_keep_the_filters_and_drop_the_defaults() -> None:
    query = MessageQuery.parse({"key": "k1", "token": "abc", "limit": "50"})
    assert query.params() == "token=abc&key=k1"
    assert query.params(token="next") == "token=next&key=k1"
    assert query.filter_params() == "key=k1"


def test_an_upper_bound_ends_with_the_precision_written() -> None:
    def until(text: str) -> datetime:
        return MessageQuery.parse({"until": text}).browse_filters()["until"]  # type: ignore[no-any-return]

    assert until("2026-11-25 11:55:16.329") == datetime(2026, 11, 25, 11, 55, 16, 329999, UTC)
    assert until("2026-11-25T11:55:16") == datetime(2026, 11, 25, 11, 55, 16, 999999, UTC)
    assert until("2026-11-25T11:55") == datetime(2026, 11, 25, 11, 55, 59, 999999, UTC)
    assert until("2026-11-25") == datetime(2026, 11, 25, 23, 59, 59, 999999, UTC)
    zoned = until("2026-11-25T12:55:16.5+01:00")
    assert zoned.astimezone(UTC) == datetime(2026, 11, 25, 11, 55, 16, 599999, UTC)
    since = MessageQuery.parse({"since": "2026-11-25T11:55:16.329"}).browse_filters()["since"]
    assert since == datetime(2026, 11, 25, 11, 55, 16, 329000, UTC)  # a lower bound: as written


def test_hex_and_text_are_written_apart_and_old_hex_links_keep_their_meaning() -> None:
    def key(text: str) -> bytes:
        return MessageQuery.parse({"key": text}).browse_filters()["key"]

    assert key("hex:deadbeef") == b"\xde\xad\xbe\xef"
    assert key("0xdeadbeef") == b"\xde\xad\xbe\xef"  # as in older links
    assert key("text:0xdeadbeef") == b"0xdeadbeef"
    assert key("text:hex:00") == b"hex:00"
    assert key("plain") == b"plain"
    with pytest.raises(BadQuery, match="text:hex:zz"):
        key("hex:zz")
    headers = MessageQuery.parse({"header": "a=0x01"}).browse_filters()["headers"]
    assert headers == {"a": b"0x01"}  # a header value was never hex by 0x: only hex:
    assert MessageQuery.parse({"header": "a=hex:01"}).browse_filters()["headers"] == {"a": b"\x01"}


def test_several_headers_all_hold_and_travel_in_links() -> None:
    from starlette.datastructures import QueryParams

    query = MessageQuery.parse(QueryParams("header=a%3D1&header=b%3D2&header=&key="))
    assert query.browse_filters()["headers"] == {"a": b"1", "b": b"2"}
    assert query.params() == "header=a%3D1&header=b%3D2"
    with pytest.raises(BadQuery, match="twice"):
        MessageQuery.parse(QueryParams("header=a%3D1&header=a%3D2"))


def test_the_steps_of_a_search_going_on_by_itself_scan_more_and_are_not_kept_by_a_tail() -> None:
    first = MessageQuery.parse({"key": "k1"})
    step = MessageQuery.parse({"key": "k1", "token": "abc", "searched": "100000"})
    assert first.browse_filters()["max_scan"] == DEFAULT_MAX_SCAN
    assert step.browse_filters()["max_scan"] == CONTINUED_MAX_SCAN
    assert step.searched_before == 100_000
    assert step.filter_params() == "key=k1"
