"""A group member belongs to the principal that joined as it (``groups.py``, "Owners"): every
call naming the member is refused to another principal, before anything changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tidelog.broker.groups import (
    GroupCoordinator,
    MemberOfAnotherPrincipal,
    read_groups,
    write_groups,
)
from tidelog.cluster.metadata import GroupRecord
from tidelog.errors import FailedPrecondition, PermissionDenied

HIJACK_EPOCH = 1 << 62


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def coordinator(path: Path | None = None, clock: Clock | None = None) -> GroupCoordinator:
    save = None if path is None else (lambda document: write_groups(path, document))
    return GroupCoordinator(lambda _stream: 2, clock=clock or Clock(), save=save)


def test_another_principal_cannot_act_as_a_member() -> None:
    groups = coordinator()
    epoch = groups.join("g", "a", ["s"], principal="alice")
    refused = [
        lambda: groups.join("g", "a", ["s"], principal="mallory"),
        lambda: groups.join("g", "a", ["other"], principal="mallory"),
        lambda: groups.leave("g", "a", principal="mallory"),
        lambda: groups.fetch_assignments("g", "a", epoch, principal="mallory"),
        lambda: groups.report_coordinator("g", "a", epoch, principal="mallory"),
        lambda: groups.admit("g", "a", epoch, "s", 0, lambda: None, principal="mallory"),
        lambda: groups.leave("g", "a", principal=""),  # anonymous is another principal
    ]
    for call in refused:
        with pytest.raises(MemberOfAnotherPrincipal, match="belongs to another principal"):
            call()
    assert groups.epoch("g") == epoch
    assert set(groups.groups["g"].members) == {"a"}
    assert groups.fetch_assignments("g", "a", epoch, principal="alice") == (
        epoch,
        {"s": [0, 1]},
    )


def test_assignments_fetched_by_another_principal_do_not_keep_a_member_alive() -> None:
    clock = Clock()
    groups = coordinator(clock=clock)
    groups.join("g", "a", ["s"], principal="alice")
    groups.join("g", "m", ["s"], principal="mallory")
    for _ in range(2):  # 20 s in all; the consumer timeout is 15 s
        with pytest.raises(PermissionDenied):
            groups.fetch_assignments("g", "a", groups.epoch("g") or 0, principal="mallory")
        clock.now += 10
        groups.expire()
        groups.fetch_assignments("g", "m", groups.epoch("g") or 0, principal="mallory")
    assert set(groups.groups["g"].members) == {"m"}, "a's silence went unnoticed"


def test_a_subscriber_cannot_fence_with_an_epoch_the_group_never_had() -> None:
    groups = coordinator()
    epoch = groups.join("g", "a", ["s"], principal="alice")
    fenced: list[str] = []
    groups.admit("g", "a", epoch, "s", 0, lambda: fenced.append("a"), principal="alice")
    with pytest.raises(FailedPrecondition, match="not 4611686018427387904"):
        groups.admit("g", "a", HIJACK_EPOCH, "s", 0, lambda: None, principal="alice")
    assert fenced == []


def test_an_unowned_member_is_bound_by_its_next_identified_join(tmp_path: Path) -> None:
    groups = coordinator()
    groups.join("g", "a", ["s"])  # anonymous (or saved before owners were): nobody's
    epoch = groups.join("g", "a", ["s"], principal="alice")
    with pytest.raises(MemberOfAnotherPrincipal):
        groups.fetch_assignments("g", "a", epoch, principal="mallory")


def test_owners_are_saved_and_restored(tmp_path: Path) -> None:
    path = tmp_path / "groups.json"
    groups = coordinator(path)
    groups.join("g", "a", ["s"], principal="alice")
    groups.join("g", "b", ["s"])
    saved = json.loads(path.read_text())
    assert saved["version"] == 1 and saved["groups"]["g"]["owners"] == {"a": "alice"}
    restored = coordinator()
    restored.restore(read_groups(path))
    epoch = restored.epoch("g")
    assert epoch is not None
    with pytest.raises(MemberOfAnotherPrincipal):
        restored.leave("g", "a", principal="mallory")
    restored.leave("g", "b", principal="mallory")  # owned by nobody: bound by no one yet


def test_a_cluster_group_record_keeps_its_owners() -> None:
    record = GroupRecord("b1", 3, {"a": ("s",)}, {"a": {"s": (0,)}}, {"a": "alice"})
    assert GroupRecord.from_json(record.to_json()) == record
    old = json.dumps(
        {"coordinator": "b1", "epoch": 3, "members": {"a": ["s"]}, "assignments": {}}
    ).encode()
    assert GroupRecord.from_json(old).owners == {}
