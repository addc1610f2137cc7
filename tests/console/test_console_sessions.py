"""The console's sessions: bounded in number, ending at their lifetime, found only by their id,
each with its own CSRF token."""

from __future__ import annotations

import pytest

from tidelog.console.sessions import Sessions, Via, csrf_matches


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_session_is_found_by_its_id_until_its_lifetime_ends() -> None:
    clock = Clock()
    sessions = Sessions(capacity=10, lifetime_s=60, clock=clock)
    session = sessions.open("alice", Via.TOKEN, "tdl_x")
    assert sessions.find(session.id) == session
    other = session.id[:-1] + ("B" if session.id[-1] != "B" else "C")
    assert sessions.find(other) is None
    assert sessions.find("") is None and sessions.find(None) is None
    clock.now += 59.9
    assert sessions.find(session.id) is not None
    clock.now += 0.1
    assert sessions.find(session.id) is None
    assert len(sessions) == 0


def test_opening_beyond_the_capacity_ends_the_oldest() -> None:
    sessions = Sessions(capacity=3, lifetime_s=60, clock=Clock())
    opened = [sessions.open(f"p{i}", Via.OPEN) for i in range(5)]
    assert len(sessions) == 3
    assert [sessions.find(s.id) is not None for s in opened] == [False, False, True, True, True]


def test_expired_sessions_make_room_before_live_ones_are_ended() -> None:
    clock = Clock()
    sessions = Sessions(capacity=2, lifetime_s=10, clock=clock)
    old = sessions.open("a", Via.OPEN)
    clock.now += 5
    young = sessions.open("b", Via.OPEN)
    clock.now += 6  # the first has expired, the second has not
    new = sessions.open("c", Via.OPEN)
    assert sessions.find(old.id) is None
    assert sessions.find(young.id) == young and sessions.find(new.id) == new


def test_ids_and_csrf_tokens_are_random_and_the_store_keeps_no_id() -> None:
    sessions = Sessions(clock=Clock())
    a, b = sessions.open("a", Via.OPEN), sessions.open("a", Via.OPEN)
    assert len({a.id, b.id, a.csrf, b.csrf}) == 4
    assert len(a.id) >= 43 and len(a.csrf) >= 43  # 32 random bytes, URL-safe
    assert a.id not in repr(sessions._by_key.keys())


def test_a_closed_session_is_not_found() -> None:
    sessions = Sessions(clock=Clock())
    session = sessions.open("a", Via.TOKEN)
    sessions.close(session.id)
    sessions.close(None)
    assert sessions.find(session.id) is None


def test_the_csrf_token_must_be_the_sessions_own() -> None:
    sessions = Sessions(clock=Clock())
    a, b = sessions.open("a", Via.OPEN), sessions.open("b", Via.OPEN)
    assert csrf_matches(a, a.csrf)
    assert not csrf_matches(a, b.csrf)
    assert not csrf_matches(a, "")
    assert not csrf_matches(a, None)
    assert not csrf_matches(None, a.csrf)


@pytest.mark.parametrize(("capacity", "lifetime"), [(0, 10.0), (5, 0.0)])
def test_a_store_needs_room_and_time(capacity: int, lifetime: float) -> None:
    with pytest.raises(ValueError):
        Sessions(capacity=capacity, lifetime_s=lifetime)


def test_a_sessions_repr_names_none_of_its_secrets() -> None:
    session = Sessions(clock=Clock()).open("alice", Via.TOKEN, "tdl_secret-token")
    shown = repr(session)
    assert "alice" in shown
    for secret in (session.id, session.csrf, "tdl_secret-token"):
        assert secret not in shown
