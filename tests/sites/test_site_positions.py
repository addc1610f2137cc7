"""Positions and their lifts (``tidelog/sites/positions.py``), what a sink's report tells the
source (``negotiation.judge_learned``), and the lifts kept in the registry and used by the delta
queue: a source rebuilt from an empty data directory never gives a sink a position it has."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.broker.brokertools import broker_config, running

from tidelog.errors import InvalidArgument
from tidelog.sites.envelope import position
from tidelog.sites.negotiation import NONE, Learned, judge_learned
from tidelog.sites.positions import MAX_RECORD, Positions
from tidelog.sites.registry import SITES_FILE, Site, SiteRegistry
from tidelog.sites.send_queue import SendQueue, Transmission
from tidelog.sites.upkeep import release_offset

P = position

# -- positions and their segments ------------------------------------------------------------------


def test_without_lifts_a_position_is_offset_and_index() -> None:
    plain = Positions()
    assert (plain.position(0), plain.position(7, 3)) == (0, P(7, 3))
    assert [plain.record_of(p) for p in (NONE, 0, P(7, 3), P(8, 0) - 1)] == [-1, 0, 7, 7]


@pytest.mark.parametrize(
    ("at", "record"),
    [
        (NONE, -1),
        (P(0, 5), 0),
        (P(4, 0), 4),
        (P(4, 9), 4),
        (P(5, 0), 4),  # in the gap the lift at 5 leaves (5 is lifted to 8): the record before
        (P(7, 65535), 4),
        (P(8, 0), 5),
        (P(10, 2), 7),
        (P(12, 0), 9),  # in the second gap (10 is lifted to 14)
        (P(14, 0), 10),
        (P(100, 0), 96),
    ],
)
def test_a_position_belongs_to_the_last_record_starting_at_or_before_it(
    at: int, record: int
) -> None:
    lifted = Positions([(5, 3), (10, 4)])
    assert (lifted.position(4), lifted.position(5), lifted.position(10, 1)) == (
        P(4, 0),
        P(8, 0),
        P(14, 1),
    )
    assert lifted.record_of(at) == record


@pytest.mark.parametrize(
    "segments",
    [[(5, 3), (5, 4)], [(5, 3), (4, 4)], [(5, 3), (6, 2)], [(-1, 0)], [(0, -1)]],
)
def test_segments_start_in_order_and_never_lift_less(segments: list[tuple[int, int]]) -> None:
    with pytest.raises(ValueError):
        Positions(segments)


def test_a_rebuilt_source_lifts_the_entries_it_stored_before_hearing_the_sink() -> None:
    """The sink processed old1..old3 at records 0..2 of the lost queue (last: P(2, 0)); the new
    queue stored new1..new3 at records 0..2 before its sender heard the sink."""
    global_, by = Positions().lifted(since=0, learned=P(2, 0), end=3)
    assert (global_.segments, by) == ([(3, 3)], 3)
    site = global_.for_site(0, lift=by, lifted_below=3)
    assert [site.position(o) for o in range(3)] == [P(3, 0), P(4, 0), P(5, 0)]
    assert site.position(3) == global_.position(3) == P(6, 0), "later records: one numbering"
    assert [global_.position(o) for o in range(3)] == [P(0, 0), P(1, 0), P(2, 0)]
    assert site.record_of(P(2, 0)) == -1, "what it knew comes before every entry it gets"
    assert [site.record_of(site.position(o)) for o in range(4)] == [0, 1, 2, 3]


def test_a_site_lifted_later_starts_above_every_position_given() -> None:
    first, by_b = Positions().lifted(since=0, learned=P(2, 0), end=3)  # b's range: 3..5
    second, by_d = first.lifted(since=1, learned=P(1, 0), end=3)  # d knew less than b
    assert by_d == 5 and second.segments == [(3, 5)]
    d = second.for_site(1, by_d, 3)
    b = second.for_site(0, by_b, 3)
    assert [d.position(o) for o in (1, 2)] == [P(6, 0), P(7, 0)]
    assert [b.position(o) for o in (0, 1, 2)] == [P(3, 0), P(4, 0), P(5, 0)]
    assert b.position(3) == d.position(3) == P(8, 0)


def test_raising_the_floor_lifts_only_what_comes_next() -> None:
    raised = Positions().raised(learned=P(9, 4), end=2)
    assert raised.segments == [(2, 8)] and raised.position(1) == P(1, 0)
    assert raised.position(2) == P(10, 0)
    assert raised.raised(learned=P(3, 0), end=5) is raised, "a floor below changes nothing"


def test_a_lift_past_the_room_of_an_int64_is_refused() -> None:
    with pytest.raises(ValueError, match="no room"):
        Positions().lifted(since=0, learned=P(MAX_RECORD, 0), end=0)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_no_two_records_ever_share_a_position(data: st.DataObject) -> None:
    """Appends, sites declared at the queue's end, lifts learned from any position and floors
    raised, in any order: every position any site sees (or a transmit answers) names one record,
    a site's positions rise with its records, and each site's lifted entries lie above what
    it reported."""
    global_ = Positions()
    end = 0
    sites: dict[str, tuple[int, int, int]] = {}  # id -> (since, lift, lifted_below)
    learned_by: dict[str, int] = {}
    for step in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["append", "declare", "lift", "raise"]))
        if action == "append":
            end += data.draw(st.integers(1, 4))
        elif action == "declare":
            sites[f"s{step}"] = (end, 0, 0)
        elif action == "lift" and sites:
            name = data.draw(st.sampled_from(sorted(sites)))
            since, lift, _ = sites[name]
            if lift:
                continue  # a site is lifted once, at its first contact
            learned = data.draw(st.integers(P(since, 0), P(since + 30, 0)))
            global_, by = global_.lifted(since, learned, end)
            sites[name] = (since, by, end)
            learned_by[name] = learned
        elif action == "raise":
            global_ = global_.raised(data.draw(st.integers(0, P(40, 0))), end)
    owner: dict[int, int] = {}
    views = {"": Positions(global_.segments)}
    views.update({n: global_.for_site(*s) for n, s in sites.items()})
    for name, view in views.items():
        since = sites[name][0] if name else 0
        seen = [view.position(o) for o in range(since, end + 3)]
        assert seen == sorted(set(seen)), f"{name}: positions rise with offsets"
        for offset, at in zip(range(since, end + 3), seen, strict=True):
            assert owner.setdefault(at, offset) == offset, f"{at} names two records"
            assert view.record_of(at) == offset
            assert view.record_of(at + 65535) == offset
        if name in learned_by:
            assert seen[0] > learned_by[name], "lifted above what the site knew"


# -- what a sink's report tells the source ---------------------------------------------------------


@pytest.mark.parametrize(
    ("heard", "learned", "verdict"),
    [
        (False, NONE, Learned.NOTHING_NEW),  # a new site, a new sink
        (False, P(3, 0) - 1, Learned.NOTHING_NEW),  # below its first entry: an earlier since
        (False, P(3, 0), Learned.LIFT),  # at its first entry here: an older queue's
        (False, P(90, 0), Learned.LIFT),  # past the end: an older, longer queue's
        (True, NONE, Learned.NOTHING_NEW),
        (True, P(7, 4), Learned.NOTHING_NEW),  # a position this queue gave
        (True, P(8, 0), Learned.BEYOND_END),  # never given: this queue's next position
        (True, P(MAX_RECORD, 0), Learned.IMPLAUSIBLE),
        (False, P(MAX_RECORD // 4 - 1, 0), Learned.LIFT),
        # Believed, it would take a quarter of the room of positions, and one just under 2**62
        # would leave no room for another lift.
        (False, P(MAX_RECORD // 4, 0), Learned.IMPLAUSIBLE),
        (True, P(MAX_RECORD - 1, 0), Learned.IMPLAUSIBLE),
        (False, P(MAX_RECORD, 0), Learned.IMPLAUSIBLE),
    ],
)
def test_what_a_sinks_position_tells(heard: bool, learned: int, verdict: Learned) -> None:
    assert judge_learned(heard, learned, first_position=P(3, 0), given_end=P(8, 0)) is verdict


# -- kept in the registry --------------------------------------------------------------------------


def test_lifts_and_what_was_learned_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / SITES_FILE
    registry = SiteRegistry("a", path)
    assert not registry.add("b", "h:1", 0).heard, "a new declaration is not heard yet"
    registry.add("c", "h:2", 0)
    lifted = registry.lift("b", P(2, 0), end=3)
    refused = registry.refuse("c", P(40, 0), end=5, reason="refused: beyond")
    again = SiteRegistry("a", path)
    assert again.get("b") == lifted and again.get("c") == refused
    assert again.positions == registry.positions == Positions([(3, 3), (5, 36)])
    assert again.positions_for(again.get("b")).position(0) == P(3, 0)
    assert again.resynced("c").resync == "" and SiteRegistry("a", path).get("c").resync == ""


def test_a_registry_from_before_counts_its_sites_heard(tmp_path: Path) -> None:
    path = tmp_path / SITES_FILE
    site = {"site_id": "b", "address": "h:1", "number": 0, "since": 4}
    path.write_text(json.dumps({"version": 1, "sites": [site]}))
    registry = SiteRegistry("a", path)
    assert registry.get("b") == Site("b", "h:1", 0, 4, heard=True)
    assert registry.positions == Positions()
    registry.heard("b")
    assert json.loads(path.read_text()) == {"version": 1, "sites": [site]}, "defaults left out"


def test_a_registry_older_versions_cannot_read_says_version_2(tmp_path: Path) -> None:
    """Version 1 is what the versions before lifts read (they refuse any other); a registry
    holding what they would ignore or choke on says version 2."""
    path = tmp_path / SITES_FILE

    def version() -> int:
        return int(json.loads(path.read_text())["version"])

    registry = SiteRegistry("a", path)
    registry.add("b", "h:1", 0)
    assert version() == 2, "a site not heard yet"
    registry.heard("b")
    assert version() == 1, "nothing an older version cannot read"
    registry.refuse("b", P(50, 0), end=3, reason="refused: beyond")
    assert version() == 2
    registry.resynced("b")
    assert version() == 2, "the lifts stay"
    assert SiteRegistry("a", path).positions == registry.positions


def test_a_registry_of_either_version_is_read_and_a_later_one_refused(tmp_path: Path) -> None:
    path = tmp_path / SITES_FILE
    site = {"site_id": "b", "address": "h:1", "number": 0, "since": 0, "heard": False}
    # The previous version wrote its new fields under version 1.
    path.write_text(json.dumps({"version": 1, "sites": [site], "lifts": [[3, 48]]}))
    assert SiteRegistry("a", path).positions == Positions([(3, 48)])
    path.write_text(json.dumps({"version": 2, "sites": [site], "lifts": [[3, 48]]}))
    assert not SiteRegistry("a", path).get("b").heard
    path.write_text(json.dumps({"version": 3, "sites": []}))
    with pytest.raises(InvalidArgument, match="unknown version 3"):
        SiteRegistry("a", path)


# -- used by the delta queue -----------------------------------------------------------------------


def test_the_queue_ships_a_lifted_sites_entries_above_what_it_knew(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = SendQueue(broker, SiteRegistry("a", tmp_path / SITES_FILE))
            queue.open()
            registry = queue.registry
            b = registry.add("b", "h:1", queue.next_offset)
            c = registry.add("c", "h:2", queue.next_offset)
            answered = []
            for i in range(3):  # new1..new3, before the sender heard b
                answered += await queue.transmit("jobs", [Transmission(b"new%d" % i, ["b", "c"])])
            assert answered == [P(0, 0), P(1, 0), P(2, 0)]
            known = P(2, 0)  # b processed old3 at the lost queue's record 2
            async with queue.positions_changing():
                b = registry.lift("b", known, queue.next_offset)
            to_b = queue.read_for(b.number, known, 100)
            assert to_b.positions.tolist() == [P(3, 0), P(4, 0), P(5, 0)]
            assert to_b.payloads == b"new0new1new2"
            to_c = queue.read_for(c.number, NONE, 100)
            assert to_c.positions.tolist() == answered, "c never knew the older queue"
            (later,) = await queue.transmit("jobs", [Transmission(b"new3", ["b", "c"])])
            assert later == P(6, 0) > P(5, 0)
            assert queue.read_for(b.number, P(5, 0), 100).positions.tolist() == [later]
            assert queue.next_position() == P(7, 0)
            # The upkeep releases what b acknowledged, counted in its own positions.
            acked = {"b": P(4, 0), "c": P(1, 0)}
            record_of = lambda site, at: registry.positions_for(site).record_of(at)  # noqa: E731
            needed = release_offset(registry.list(), acked, queue.next_offset, queue.index)
            assert needed == 2, "read as plain positions, b's ack would be record 4"
            b_only = release_offset([b], acked, queue.next_offset, queue.index, record_of)
            assert b_only == 2, "b acknowledged its lifted record 4: offset 1"

    asyncio.run(main())


def test_transmits_wait_while_the_lifts_change(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(broker_config(tmp_path)) as broker:
            queue = SendQueue(broker, SiteRegistry("a", tmp_path / SITES_FILE))
            queue.open()
            queue.registry.add("b", "h:1", 0)
            async with queue.positions_changing():
                sending = asyncio.create_task(queue.transmit("jobs", [Transmission(b"x", ["b"])]))
                await asyncio.sleep(0.05)
                assert not sending.done() and queue.next_offset == 0, "held back"
                queue.registry.lift("b", P(9, 0), queue.next_offset)
            assert await sending == [P(10, 0)], "answered with the lifts it was stored under"

    asyncio.run(main())
