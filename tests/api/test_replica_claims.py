"""A broker id an inter-broker request claims is the caller's own identity when the caller was
identified (``replica_service.claimed_broker``); an anonymous caller's claim is taken as it is
(no TLS, or TLS without client certificates: the documented gap)."""

from __future__ import annotations

import contextvars

import pytest

from tidelog.access import ANONYMOUS, Caller, Guard, serving
from tidelog.api.replica_service import claimed_broker
from tidelog.errors import PermissionDenied


def _as(identity: str, claimed: str) -> None:
    def run() -> None:
        serving(Caller(identity, Guard()))
        claimed_broker(claimed, "fetch as follower")

    contextvars.copy_context().run(run)


def test_a_broker_fetches_in_its_own_name() -> None:
    _as("b2", "b2")


@pytest.mark.parametrize("identity", ["b1", "admin"])
def test_an_identified_caller_claiming_another_broker_is_refused_naming_the_claim(
    identity: str,
) -> None:
    with pytest.raises(PermissionDenied, match=f"{identity} may not fetch as follower 'b2'"):
        _as(identity, "b2")


def test_an_anonymous_claim_is_taken_as_it_is() -> None:
    _as(ANONYMOUS, "b2")
