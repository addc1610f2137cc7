"""The messages page's query string: parsed, checked, and turned into a browse call's arguments.

Every filter is data handed to the server's ``Browse`` (key equals or starts with, a header
equals, the value contains, a time range); nothing a person types is ever evaluated as code.
Times are ISO 8601; one without a zone is UTC (what the pages show). Bytes are written as
the pages show them (:func:`parse_bytes`): ``hex:…`` is hex bytes, ``text:…`` is the text after
the prefix (so a text key ``0xbeef`` is found as ``text:0xbeef``), anything else is UTF-8 text;
a key, prefix or ``contains`` written ``0x…`` is hex too, as in older links. Several headers
may be given (``header=a=1&header=b=2``): all must hold.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from tidelog.console.render import HEX_PREFIX, LEGACY_HEX_PREFIX, TEXT_PREFIX

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
DEFAULT_MAX_SCAN = 100_000
"""Messages a filtered page may scan on the server before it reports how far back it got."""
DEFAULT_MAX_SCAN_SECONDS = 2.0
CONTINUED_MAX_SCAN = 1_000_000
"""What each step of a search that goes on by itself may scan (its first page scans less, to
answer at once)."""
CONTINUED_MAX_SCAN_SECONDS = 1.5
SEARCH_BOUND = 10_000_000
"""A search goes on by itself until it has scanned this many messages (the page says so)."""
SEARCH_STEPS = 30
"""...or until it has taken this many steps (a step cut by its time budget scans little)."""


EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2262, 4, 11, tzinfo=UTC)
"""The times a filter may name: a message's timestamp is nanoseconds since 1970 in an int64,
which ends on 2262-04-11."""
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1


class BadQuery(ValueError):
    """A field of the query cannot be understood; the message names it and says what fits."""


def parse_time(text: str, field: str, *, end: bool = False) -> datetime:
    """``text`` as an aware datetime (UTC when it names no zone). With ``end``, the last
    microsecond of the precision written: ``11:42:07.123`` ends at ``.123999``, ``11:42:07`` at
    ``07.999999``, ``11:42`` at ``42:59.999999`` — a time copied from a page (shown to the
    millisecond) as an upper bound then includes the messages of that millisecond."""
    written = text.strip().replace(" ", "T", 1)
    try:
        moment = datetime.fromisoformat(written)
    except ValueError:
        raise BadQuery(
            f"{field}: {text!r} is not a time; write it as 2026-11-25T11:42:07 (UTC) or with a "
            f"zone, 2026-11-25T12:42:07+01:00"
        ) from None
    moment = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    if not EARLIEST <= moment <= LATEST:
        raise BadQuery(
            f"{field}: {text!r} is out of range; give a time between {EARLIEST:%Y-%m-%d} and "
            f"{LATEST:%Y-%m-%d} (what a timestamp in nanoseconds can hold)"
        )
    if end:
        moment = min(moment + _precision(written) - timedelta(microseconds=1), LATEST)
    return moment


def _precision(written: str) -> timedelta:
    """The unit of the last digit written in an ISO time: a day, a minute, a second or less."""
    clock = written.partition("T")[2]
    clock = re.split(r"[+-]|Z", clock, maxsplit=1)[0]
    if not clock:
        return timedelta(days=1)
    whole, _, fraction = clock.partition(".")
    if fraction:
        return timedelta(seconds=10 ** -min(len(fraction), 6))
    return timedelta(seconds=1) if whole.count(":") >= 2 else timedelta(minutes=1)


def parse_bytes(text: str, field: str, *, legacy_hex: bool = True) -> bytes:
    """Bytes as a filter writes them: ``hex:…`` (and, with ``legacy_hex``, ``0x…``) is hex,
    ``text:…`` the text after the prefix, anything else UTF-8 text."""
    for prefix in (HEX_PREFIX, LEGACY_HEX_PREFIX) if legacy_hex else (HEX_PREFIX,):
        if text.startswith(prefix):
            try:
                return bytes.fromhex(text[len(prefix) :])
            except ValueError:
                raise BadQuery(
                    f"{field}: {text!r} starts with {prefix} but is not hex; to find that text, "
                    f"write it {TEXT_PREFIX}{text}"
                ) from None
    return text.removeprefix(TEXT_PREFIX).encode()


def _int(value: str, field: str, low: int, high: int | None = None) -> int:
    try:
        number = int(value)
    except ValueError:
        raise BadQuery(f"{field}: {value!r} is not a whole number") from None
    if number < low or (high is not None and number > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadQuery(f"{field}: {number} is out of range; give a number {bound}")
    return number


int_field = _int
"""A whole number from a form, between ``low`` and ``high``; else :class:`BadQuery` naming the
field (other pages' fields use it too)."""


@dataclass(frozen=True, slots=True)
class MessageQuery:
    """The messages page's state, all of it in the URL (so a page can be linked and reloaded)."""

    limit: int = DEFAULT_LIMIT
    order: str = "newest"
    """``newest`` (first) or ``oldest``."""
    token: str = ""
    """continue from an earlier page (the server's continuation token)"""
    at: str = ""
    """start at this time instead of now (newest first: at or before it, to the last microsecond
    of the precision written; oldest first: at or after it)"""
    partition: str = ""
    """comma-separated partitions to read (all when empty)"""
    offset: str = ""
    """jump to this offset of ``partition`` (one partition)"""
    key: str = ""
    key_prefix: str = ""
    header: tuple[str, ...] = ()
    """``name=value`` each (the URL repeats ``header``); all must hold"""
    contains: str = ""
    since: str = ""
    until: str = ""
    searched: str = ""
    """messages the earlier steps of a search going on by itself scanned (set on its steps)"""
    steps: str = ""
    """the steps a search has taken by itself, this one included (set on its steps)"""

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> MessageQuery:
        """The query from a URL's parameters (a multi-dict's repeated ``header`` each count);
        unknown parameters and empty ones are ignored, bad ones raise :class:`BadQuery`."""
        names = {f.name for f in fields(cls)} - {"header"}
        values: dict[str, Any] = {
            k: v.strip() for k, v in params.items() if k in names and v.strip()
        }
        getlist = getattr(params, "getlist", None)
        headers: Sequence[str] = getlist("header") if getlist else [params.get("header", "")]
        if any(h.strip() for h in headers):
            values["header"] = tuple(h.strip() for h in headers if h.strip())
        if "limit" in values:
            values["limit"] = _int(values["limit"], "limit", 1, MAX_LIMIT)
        query = cls(**values)
        if query.order not in ("newest", "oldest"):
            raise BadQuery(f"order: {query.order!r} is neither 'newest' nor 'oldest'")
        query.browse_filters()  # every field checked now, not when a link is followed
        query.partitions()
        if query.offset:
            _int(query.offset, "offset", 0, MAX_OFFSET)
            if len(query.partitions() or ()) != 1:
                raise BadQuery("offset: choose exactly one partition to jump to an offset in")
        if query.at:
            parse_time(query.at, "at")
        if query.searched:
            _int(query.searched, "searched", 0)
        if query.steps:
            _int(query.steps, "steps", 0)
        return query

    @property
    def newest_first(self) -> bool:
        return self.order == "newest"

    @property
    def filtered(self) -> bool:
        return any((self.key, self.key_prefix, self.header, self.contains, self.since, self.until))

    def partitions(self) -> list[int] | None:
        if not self.partition:
            return None
        return [
            _int(p.strip(), "partition", 0, MAX_PARTITION)
            for p in self.partition.split(",")
            if p.strip()
        ]

    def browse_filters(self) -> dict[str, Any]:
        """The filter arguments of ``Client.browse`` (partitions, key, prefix, header, contains,
        since, until), with the scan budget when any filter is set."""
        args: dict[str, Any] = {}
        if self.partition:
            args["partitions"] = self.partitions()
        if self.key:
            args["key"] = parse_bytes(self.key, "key")
        if self.key_prefix:
            args["key_prefix"] = parse_bytes(self.key_prefix, "key prefix")
        if self.header:
            args["headers"] = {}
            for header in self.header:
                name, sep, value = header.partition("=")
                if not sep or not name.strip():
                    raise BadQuery(f"header: {header!r} is not name=value")
                if name.strip() in args["headers"]:
                    raise BadQuery(f"header: {name.strip()!r} is given twice; give it once")
                args["headers"][name.strip()] = parse_bytes(value, "header", legacy_hex=False)
        if self.contains:
            args["contains"] = parse_bytes(self.contains, "contains")
        if self.since:
            args["since"] = parse_time(self.since, "since")
        if self.until:
            args["until"] = parse_time(self.until, "until", end=True)
        if self.filtered and self.searched:
            args["max_scan"] = CONTINUED_MAX_SCAN
            args["max_scan_seconds"] = CONTINUED_MAX_SCAN_SECONDS
        elif self.filtered:
            args["max_scan"] = DEFAULT_MAX_SCAN
            args["max_scan_seconds"] = DEFAULT_MAX_SCAN_SECONDS
        return args

    @property
    def searched_before(self) -> int:
        return int(self.searched or 0)

    @property
    def steps_taken(self) -> int:
        return int(self.steps or 0)

    def params(self, **changes: Any) -> str:
        """This query with ``changes`` as a URL query string (defaults left out)."""
        query = replace(self, **changes)
        default = MessageQuery()
        return urlencode(
            {
                f.name: getattr(query, f.name)
                for f in fields(query)
                if getattr(query, f.name) != getattr(default, f.name)
            },
            doseq=True,
        )

    def filter_params(self) -> str:
        """Only the filters (no position): what a live tail or a fresh first page keeps."""
        return self.params(token="", at="", offset="", order="newest", searched="", steps="")
