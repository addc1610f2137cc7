"""Consumer groups on one broker (Liftbridge's JoinConsumerGroup & co.), kept across restarts.

A group is created by its first join and deleted when its last member leaves or expires. Every
membership change (join, leave, expiry) raises the group's epoch and reshuffles the
assignments: for each stream, partition 0..n-1 goes in turn to the member holding the fewest
partitions so far (members in consumer-id order). Members poll ``fetch_assignments`` with the
epoch they know: that call is also their heartbeat; a member silent for ``consumer_timeout_s``
is removed. Subscriptions made on behalf of a group carry its epoch: a partition keeps one
subscriber per group, a subscriber with a newer-or-equal epoch replaces (fences) the old one,
and one with an older epoch is refused. On a single broker it is always the coordinator.

Durability. Every group's epoch, members (with their streams) and assignments are saved as one
JSON document, ``<data_dir>/groups.json`` (:data:`GROUPS_FILE`), replaced atomically (temp file,
fsync, rename: :func:`tidelog.durable.replace_json`) after every membership change, so
a member carries on after a restart or a crash with the epoch and partitions it had, without
joining again. The coordinator itself does no I/O: it is given a ``save`` callable, and the
broker hands it what :func:`read_groups` found at start. Rules:

- a change is kept only once it is saved: when saving fails (a full disk: ``DiskFull``) the
  change is undone in memory and the join or leave raises the error, so memory never runs
  ahead of the file. An expiry that cannot be saved is undone too (the silent members stay,
  with one WARNING) and tried again at the next expiry check;
- heartbeats are not saved: at load every member's ``last_seen`` is the clock's now, so each
  member gets a full consumer timeout to come back after a restart;
- subscriber registrations (fencing) are not saved: subscriptions end with the process;
- a missing file means no groups; an unreadable or malformed one stops the start with
  :class:`~tidelog.errors.GroupStateUnreadable` naming the file, rather than drop the groups;
- positions are not here: they are cursors (``__group:<group id>``) in ``__cursors``.

Owners. A member id belongs to the principal that joined with it (``owner``; "" for a member
that joined anonymously or before owners were saved: the next identified join binds it). Every
call naming a member (join again, leave, fetch assignments, report the coordinator, subscribe
for the group) takes the caller's ``principal`` and is :class:`MemberOfAnotherPrincipal`
(``PermissionDenied``) when another principal owns the member, before anything changes: it can
neither remove the member, keep it alive by heartbeats, take over its id nor fence its
subscribers. ``principal=None`` acts for the owner, whoever it is: the server's own calls and
those another broker of the cluster passes on for a member. Owners are saved as the document's
optional ``owners`` (consumer id -> principal), which older versions ignore.


Saving runs off the event loop: the broker attaches a writer (``group_writer.py``) that writes
the latest document in a thread and coalesces every change made meanwhile into its next write,
and a join or leave is answered once a write holding it is durable. Other members may see a
change before it is saved; if the write fails, every change since the last durable write is
undone and the joins and leaves waiting for it raise (``DiskFull`` & co.), as above. A
coordinator given a ``save`` callable instead saves on the spot (tests, tools). In a cluster
the groups live in etcd instead (``tidelog.cluster.groups``) and this object only mirrors them
(:meth:`GroupCoordinator.mirror`): it keeps the heartbeats the coordinator sees and fences
subscribers on partitions led here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tidelog.durable import replace_json
from tidelog.errors import (
    FailedPrecondition,
    GroupNotFound,
    GroupStateUnreadable,
    InvalidArgument,
    LimitReached,
    PermissionDenied,
    ResourceExhausted,
    echo,
)

LOG = logging.getLogger("tidelog.broker")

GROUPS_FILE: Final = "groups.json"
"""The saved consumer groups, in the broker's data directory."""

FORMAT_VERSION: Final = 1
"""Version of the saved document; a file of another version is refused, never guessed at."""

SaveGroups = Callable[[dict[str, Any]], None]
"""Makes a saved document durable, or raises (and then leaves the previous one in place)."""


@dataclass(slots=True)
class GroupMember:
    consumer_id: str
    streams: list[str]
    last_seen: float
    owner: str = ""
    """The principal that joined with this id ("": nobody yet; module docstring)."""


class MemberOfAnotherPrincipal(PermissionDenied):
    """A call naming a group member that another principal joined as (module docstring)."""

    def __init__(self, group_id: str, consumer_id: str) -> None:
        super().__init__(
            f"consumer {consumer_id!r} of group {group_id!r} belongs to another principal: join "
            f"with a consumer id of your own"
        )


def check_owner(owner: str, principal: str | None, group_id: str, consumer_id: str) -> None:
    """Raise :class:`MemberOfAnotherPrincipal` unless ``principal`` may act as a member that
    ``owner`` joined as (module docstring: None acts for any owner, and "" is owned by nobody)."""
    if principal is not None and owner and owner != principal:
        raise MemberOfAnotherPrincipal(group_id, consumer_id)


@dataclass(slots=True)
class Group:
    group_id: str
    epoch: int = 0
    members: dict[str, GroupMember] = field(default_factory=dict)
    assignments: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    subscribers: dict[tuple[str, int], tuple[int, Callable[[], None]]] = field(default_factory=dict)
    """(stream, partition) -> (epoch of the subscriber, how to fence it)"""


Checkpoint = list[tuple[Group, int, dict[str, GroupMember], dict[str, dict[str, list[int]]]]]
"""The groups as they were (:meth:`GroupCoordinator.checkpoint`), to put back."""


class GroupCoordinator:
    """Every group of this broker. ``save`` receives :meth:`document` after each membership
    change (None: nothing is saved); ``restore`` installs what was saved."""

    def __init__(
        self,
        partition_counts: Callable[[str], int],
        *,
        consumer_timeout_s: float = 15.0,
        coordinator_timeout_s: float = 15.0,
        clock: Callable[[], float] = time.monotonic,
        save: SaveGroups | None = None,
        max_groups: int | None = None,
    ) -> None:
        self._partition_counts = partition_counts
        self.consumer_timeout_s = consumer_timeout_s
        self.coordinator_timeout_s = coordinator_timeout_s
        self._clock = clock
        self._save = save
        self._expiry_unsaved = False
        """An expiry could not be saved (logged once until one succeeds)."""
        self.mirrored = False
        """The groups are decided elsewhere (a cluster's metadata, ``tidelog.cluster.groups``)
        and installed here: nothing is saved or expired by this object."""
        self.groups: dict[str, Group] = {}
        self.changed: Callable[[], None] | None = None
        """Called after each membership change: a writer saving off the loop
        (``group_writer.py``), which then stands for ``save``."""
        self.max_groups = max_groups

    # -- durability ------------------------------------------------------------------------------

    def mirror(self) -> None:
        """From now on hold what a cluster decides (see :attr:`mirrored`); groups restored
        from this broker's own file are dropped, with a WARNING naming them."""
        if self.groups:
            LOG.warning(
                "consumer groups %s from this broker's %s are not used in a cluster: their "
                "members must join again",
                ", ".join(sorted(self.groups)),
                GROUPS_FILE,
            )
        self.mirrored = True
        self._save = None
        self.changed = None
        self.groups = {}

    def document(self) -> dict[str, Any]:
        """Every group as the JSON document that is saved (heartbeats and subscribers left out)."""
        return encode(self.groups)

    def restore(self, groups: Mapping[str, Group]) -> None:
        """Install saved groups (at start, before any member calls). Every member counts as
        seen now: it has a full consumer timeout to come back."""
        now = self._clock()
        self.groups = dict(groups)
        for group in self.groups.values():
            for member in group.members.values():
                member.last_seen = now

    def checkpoint(self) -> Checkpoint:
        """What :meth:`revert` needs to put the groups back as they are now."""
        return [(g, g.epoch, dict(g.members), g.assignments) for g in self.groups.values()]

    def revert(self, checkpoint: Checkpoint) -> None:
        """Put the groups back as they were at ``checkpoint``. The same Group objects go back:
        fencing callbacks hold on to them."""
        self.groups = {}
        for group, epoch, members, assignments in checkpoint:
            group.epoch, group.members, group.assignments = epoch, members, assignments
            self.groups[group.group_id] = group

    @contextlib.contextmanager
    def _saved_change(self) -> Iterator[None]:
        """Run a membership change, then save (or, with a writer attached, tell it: it saves
        off the loop, :mod:`tidelog.broker.group_writer`); if the change or a save here fails,
        undo the change and raise."""
        before = self.checkpoint()
        try:
            yield
            if self._save is not None:
                self._save(self.document())
        except BaseException:
            self.revert(before)
            raise
        if self.changed is not None:
            self.changed()

    def epoch(self, group_id: str) -> int | None:
        """The group's current epoch, or None when no such group exists."""
        group = self.groups.get(group_id)
        return None if group is None else group.epoch

    # -- membership ------------------------------------------------------------------------------

    def join(
        self, group_id: str, consumer_id: str, streams: list[str], *, principal: str | None = None
    ) -> int:
        """Add (or refresh) a member; returns the group's epoch after the change. A change that
        cannot be saved raises (``DiskFull`` & co.) and leaves the group as it was. Joining as a
        member another principal owns is :class:`MemberOfAnotherPrincipal`."""
        check_group_join(group_id, consumer_id, streams)
        for stream in streams:
            self._partition_counts(stream)  # raises StreamNotFound
        self.expire()
        now = self._clock()
        known_group = self.groups.get(group_id)
        known = None if known_group is None else known_group.members.get(consumer_id)
        owner = "" if known is None else known.owner
        check_owner(owner, principal, group_id, consumer_id)
        owner = owner or principal or ""
        if known_group is not None and known is not None and known.streams == list(streams):
            known.last_seen = now  # a refresh: nothing changes, nothing to save
            if owner != known.owner:  # an unowned member bound by its first identified join
                with self._saved_change():
                    known_group.members[consumer_id] = GroupMember(
                        consumer_id, known.streams, now, owner
                    )
            return known_group.epoch
        full = self.max_groups is not None and len(self.groups) >= self.max_groups
        if known_group is None and full:
            raise LimitReached(
                "max_groups",
                f"consumer group {echo(group_id)} is not created: this broker coordinates "
                f"{len(self.groups)} groups, the most it may",
            )
        with self._saved_change():
            group = self.groups.setdefault(group_id, Group(group_id))
            group.members[consumer_id] = GroupMember(consumer_id, list(streams), now, owner)
            self._rebalance(group)
        return group.epoch

    def _member(self, group_id: str, consumer_id: str, principal: str | None) -> GroupMember:
        """The member a call names, checked against the caller's ``principal``."""
        group = self._group(group_id)
        member = group.members.get(consumer_id)
        if member is None:
            raise FailedPrecondition(f"{consumer_id!r} is not a member of group {group_id!r}")
        check_owner(member.owner, principal, group_id, consumer_id)
        return member

    def leave(self, group_id: str, consumer_id: str, *, principal: str | None = None) -> None:
        """Remove a member (the group with its last one); raises ``DiskFull`` & co., the member
        still in, when the change cannot be saved."""
        group = self._group(group_id)
        self._member(group_id, consumer_id, principal)
        with self._saved_change():
            del group.members[consumer_id]
            self._after_removal(group)

    def fetch_assignments(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> tuple[int, dict[str, list[int]]]:
        """The member's partitions per stream, at the group's epoch (also its heartbeat)."""
        self.expire()
        group = self._group(group_id)
        member = self._member(group_id, consumer_id, principal)
        if epoch != group.epoch:
            raise FailedPrecondition(
                f"group {group_id!r} is at epoch {group.epoch}, not {epoch}; fetch its metadata "
                f"and try again"
            )
        member.last_seen = self._clock()
        return group.epoch, group.assignments.get(consumer_id, {})

    def report_coordinator(
        self, group_id: str, consumer_id: str, epoch: int, *, principal: str | None = None
    ) -> None:
        """A member suspects the coordinator. On one broker there is no other to elect: the
        report is checked (member, epoch) and changes nothing."""
        group = self._group(group_id)
        self._member(group_id, consumer_id, principal)
        if epoch != group.epoch:
            raise FailedPrecondition(f"group {group_id!r} is at epoch {group.epoch}, not {epoch}")

    def expire(self) -> None:
        """Remove members silent for longer than the consumer timeout. If that cannot be saved,
        they stay (a WARNING says so) until a later call manages to; this never raises for it,
        since the caller is another member's heartbeat or the broker's maintenance."""
        if self.mirrored:
            return  # the group's coordinator expires members through the cluster's metadata
        now = self._clock()
        timeout = self.consumer_timeout_s
        silent = [
            (group, [m for m in group.members.values() if now - m.last_seen > timeout])
            for group in self.groups.values()
        ]
        if not any(members for _, members in silent):
            return
        try:
            with self._saved_change():
                for group, members in silent:
                    for member in members:
                        del group.members[member.consumer_id]
                    if members:
                        self._after_removal(group)
        except (ResourceExhausted, OSError) as error:
            if not self._expiry_unsaved:
                LOG.warning(
                    "silent consumer-group members stay until their removal can be saved: %s",
                    error,
                )
            self._expiry_unsaved = True
            return
        self._expiry_unsaved = False

    # -- fencing subscribers ---------------------------------------------------------------------

    def admit(
        self,
        group_id: str,
        consumer_id: str,
        epoch: int,
        stream: str,
        partition: int,
        fence: Callable[[], None],
        *,
        principal: str | None = None,
    ) -> Callable[[], None]:
        """Admit a group subscriber to a partition; returns how to deregister it.

        An older epoch than the partition's current group subscriber is refused; a newer or
        equal one fences (ends) that subscriber. An epoch the group has not reached is refused
        too: it would fence every later subscriber of the partition, its owner's included. So
        is a partition the group does not assign to ``consumer_id`` at this epoch: it would
        fence the member it is assigned to.
        """
        group = self._group(group_id)
        self._member(group_id, consumer_id, principal)
        if epoch < group.epoch:
            raise FailedPrecondition(
                f"stale group epoch {epoch}: group {group_id!r} is at epoch {group.epoch}"
            )
        if epoch > group.epoch:
            raise FailedPrecondition(
                f"group {group_id!r} is at epoch {group.epoch}, not {epoch}: fetch its "
                f"assignments and subscribe with the epoch they give"
            )
        if partition not in group.assignments.get(consumer_id, {}).get(stream, ()):
            raise FailedPrecondition(
                f"partition {partition} of {stream!r} is not assigned to consumer "
                f"{consumer_id!r} of group {group_id!r} at epoch {epoch}: subscribe to the "
                f"partitions its assignments give"
            )
        current = group.subscribers.get((stream, partition))
        if current is not None:
            if epoch < current[0]:
                raise FailedPrecondition(
                    f"a subscriber with a newer epoch ({current[0]}) holds {stream}/{partition}"
                )
            current[1]()
        group.subscribers[(stream, partition)] = (epoch, fence)

        def release() -> None:
            if group.subscribers.get((stream, partition), (None, None))[1] is fence:
                del group.subscribers[(stream, partition)]

        return release

    # -- internals -------------------------------------------------------------------------------

    def _group(self, group_id: str) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            raise GroupNotFound(f"no such consumer group: {group_id!r}")
        return group

    def _after_removal(self, group: Group) -> None:
        if group.members:
            self._rebalance(group)
        else:
            del self.groups[group.group_id]

    def _rebalance(self, group: Group) -> None:
        group.epoch += 1
        group.assignments = assign_partitions(
            {m.consumer_id: m.streams for m in group.members.values()}, self._partition_counts
        )


def check_group_join(group_id: str, consumer_id: str, streams: Sequence[str]) -> None:
    """``InvalidArgument`` for a join that names no group, consumer or stream."""
    if not group_id or not consumer_id:
        raise InvalidArgument("joining a consumer group needs a group id and a consumer id")
    if not streams:
        raise InvalidArgument("joining a consumer group needs at least one stream")


def assign_partitions(
    members: Mapping[str, Sequence[str]], partition_counts: Callable[[str], int]
) -> dict[str, dict[str, list[int]]]:
    """Each member's partitions (consumer id -> stream -> partitions): for each stream, its
    partitions 0..n-1 in turn to the member that takes it and holds the fewest so far (ties by
    consumer id). A stream ``partition_counts`` cannot count (deleted since) is left out."""
    ids = sorted(members)
    assignments: dict[str, dict[str, list[int]]] = {m: {} for m in ids}
    load = dict.fromkeys(ids, 0)
    for stream in sorted({s for streams in members.values() for s in streams}):
        try:
            count = partition_counts(stream)
        except Exception:  # a stream deleted since the join: nothing to assign
            continue
        takers = [m for m in ids if stream in members[m]]
        for partition in range(count):
            chosen = min(takers, key=lambda m: (load[m], m))
            assignments[chosen].setdefault(stream, []).append(partition)
            load[chosen] += 1
    return assignments


# -- the saved document --------------------------------------------------------------------------


def encode(groups: Mapping[str, Group]) -> dict[str, Any]:
    """``{"version": 1, "groups": {id: {"epoch", "members": {consumer: [streams]},
    "assignments": {consumer: {stream: [partitions]}}, "owners": {consumer: principal}}}}``
    (``owners`` only for members that have one)."""
    return {
        "version": FORMAT_VERSION,
        "groups": {
            group.group_id: {
                "epoch": group.epoch,
                "members": {m.consumer_id: list(m.streams) for m in group.members.values()},
                **_owners(group),
                "assignments": {
                    consumer: {stream: list(parts) for stream, parts in streams.items()}
                    for consumer, streams in group.assignments.items()
                },
            }
            for group in groups.values()
        },
    }


def _owners(group: Group) -> dict[str, dict[str, str]]:
    owners = {m.consumer_id: m.owner for m in group.members.values() if m.owner}
    return {"owners": owners} if owners else {}


def decode(document: object) -> dict[str, Group]:
    """The groups of a saved document (every ``last_seen`` 0: :meth:`GroupCoordinator.restore`
    sets it). Raises ``ValueError`` saying what does not fit the format."""
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        found = document.get("version") if isinstance(document, dict) else type(document).__name__
        raise ValueError(f"not a version-{FORMAT_VERSION} groups document (version {found!r})")
    saved = _typed(document.get("groups"), dict, "groups")
    groups: dict[str, Group] = {}
    for group_id, entry in saved.items():
        where = f"group {group_id!r}"
        _typed(entry, dict, where)
        epoch = entry.get("epoch")
        if type(epoch) is not int or epoch < 1:
            raise ValueError(f"{where}: epoch {epoch!r} is not a positive integer")
        group = Group(group_id, epoch)
        members = _typed(entry.get("members"), dict, f"{where} members")
        if not members:
            raise ValueError(f"{where} has no members (an empty group is never saved)")
        owners = _typed(entry.get("owners", {}), dict, f"{where} owners")
        for consumer_id, streams in members.items():
            owner = owners.get(consumer_id, "")
            if not isinstance(owner, str):
                raise ValueError(f"{where} owner of {consumer_id!r}: {owner!r} is not a string")
            group.members[consumer_id] = GroupMember(
                consumer_id, _strings(streams, f"{where} member {consumer_id!r}"), 0.0, owner
            )
        assignments = _typed(entry.get("assignments"), dict, f"{where} assignments")
        for consumer_id, streams in assignments.items():
            if consumer_id not in group.members:
                raise ValueError(f"{where} assigns partitions to a non-member {consumer_id!r}")
            _typed(streams, dict, f"{where} assignments of {consumer_id!r}")
            group.assignments[consumer_id] = {
                stream: _partitions(parts, f"{where} assignment {consumer_id!r}/{stream!r}")
                for stream, parts in streams.items()
            }
        groups[group_id] = group
    return groups


def read_groups(path: Path) -> dict[str, Group]:
    """The groups saved at ``path``; none when there is no file. Anything unreadable raises
    :class:`GroupStateUnreadable` naming the file (groups are never dropped silently)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except OSError as error:
        raise GroupStateUnreadable(_unreadable(path, str(error))) from error
    try:
        return decode(json.loads(raw))
    except ValueError as error:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise GroupStateUnreadable(_unreadable(path, str(error))) from error


def write_groups(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` with ``document`` atomically (``DiskFull`` & co. leave the old file)."""
    replace_json(path, document, indent=1, sort_keys=True)


def _unreadable(path: Path, reason: str) -> str:
    return (
        f"cannot restore consumer groups from {path}: {reason}. The server does not start "
        f"rather than lose them: restore the file, or move it away to start without groups "
        f"(their members must then join again)"
    )


def _typed(value: object, kind: type, where: str) -> Any:
    if not isinstance(value, kind):
        raise ValueError(f"{where}: expected a {kind.__name__}, found {type(value).__name__}")
    return value


def _strings(value: object, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a non-empty list of stream names, found {value!r}")
    return list(value)


def _partitions(value: object, where: str) -> list[int]:
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ValueError(f"{where}: expected a list of partition numbers, found {value!r}")
    return list(value)
