"""Entries as columns and the two forms of a ``DeltaBatch`` (``tidelog/sites/routed.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.sites.routed import RoutedColumns, RoutedEntry, from_wire, to_wire

clients = st.sampled_from(["app", "orders", "kv"])


@st.composite
def entry_lists(draw: st.DrawFn) -> list[RoutedEntry]:
    steps = draw(st.lists(st.integers(1, 70_000), min_size=0, max_size=40))
    positions = np.cumsum(steps).tolist()
    return [RoutedEntry(p, draw(clients), draw(st.binary(max_size=40))) for p in positions]


def wire_round_trip(entries: RoutedColumns, *, packed: bool) -> RoutedColumns:
    prev, current = -1, int(entries.positions[-1]) if len(entries) else 0
    message = to_wire(prev, current, entries, packed=packed)
    return from_wire(v1.DeltaBatch.FromString(message.SerializeToString()))


@settings(max_examples=300, deadline=None)
@given(entry_lists())
def test_columns_hold_the_entries_in_order(entries: list[RoutedEntry]) -> None:
    columns = RoutedColumns.from_entries(entries).checked()
    assert list(columns) == entries
    assert [columns[i] for i in range(len(entries))] == entries
    assert columns[1:3] == entries[1:3]
    assert [e.client for e in entries] == [
        client for client, start, end in columns.runs() for _ in range(start, end)
    ]


@settings(max_examples=300, deadline=None)
@given(entry_lists().filter(bool), st.booleans())
def test_both_wire_forms_carry_the_same_entries(entries: list[RoutedEntry], packed: bool) -> None:
    assert list(wire_round_trip(RoutedColumns.from_entries(entries), packed=packed)) == entries


@settings(max_examples=300, deadline=None)
@given(entry_lists(), st.integers(0, 40), st.integers(0, 40), st.integers(-1, 10**6))
def test_take_after_and_concat_agree_with_lists(
    entries: list[RoutedEntry], start: int, end: int, at: int
) -> None:
    columns = RoutedColumns.from_entries(entries)
    assert list(columns.take(start, end)) == entries[start:end]
    assert list(columns.after(at)) == [e for e in entries if e.position > at]
    halves = [columns.take(0, start), columns.take(start, len(entries))]
    joined = RoutedColumns.concat(halves).checked()
    assert list(joined) == entries
    assert len(joined.clients) == len(RoutedColumns.from_entries(entries).clients)


def test_a_sink_from_before_the_packed_fields_gets_entries_only() -> None:
    """An older sink reads ``entries`` and knows nothing else: the sender sends it nothing
    else (it sends packed columns only to a sink whose progress says ``packed_deltas``)."""
    entries = [RoutedEntry(5, "app", b"a"), RoutedEntry(9, "app", b"b")]
    message = to_wire(-1, 9, RoutedColumns.from_entries(entries), packed=False)
    assert [(e.position, e.client_name, e.payload) for e in message.entries] == [
        (5, "app", b"a"),
        (9, "app", b"b"),
    ]
    assert not (message.positions or message.payload_sizes or message.payloads)
    assert not (message.run_clients or message.run_lengths)
    packed = to_wire(-1, 9, RoutedColumns.from_entries(entries), packed=True)
    assert not packed.entries and len(packed.positions) == 16


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"positions": b"\0" * 7}, "whole number"),
        ({"payload_sizes": b"\1\0\0\0", "payloads": b"", "positions": b"\0" * 8}, "add up"),
        ({"positions": b"\0" * 8, "payload_sizes": b"\0" * 4}, "runs cover 0 entries"),
        (
            {
                "positions": b"\0" * 8,
                "payload_sizes": b"\0" * 4,
                "run_clients": ["a"],
                "run_lengths": b"\0\0\0\0",
            },
            "run of no entries",
        ),
        (
            {"positions": b"\0" * 8, "payload_sizes": b"\0" * 8},
            "1 positions but 2 payload sizes",
        ),
        (
            {"positions": b"\0" * 8, "entries": [v1.RoutedEntry(position=1, client_name="a")]},
            "not both",
        ),
    ],
)
def test_columns_that_do_not_fit_together_are_refused(
    fields: dict[str, object], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        from_wire(v1.DeltaBatch(prev=-1, current=0, **fields))  # type: ignore[arg-type]
