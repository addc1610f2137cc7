"""What a call does to what: the operations and resources every front's calls are checked for.

Each front names, for each of its calls, the :class:`Access` it needs (an operation on a
resource): the gRPC services in ``tidelog.api.guard`` (one table entry per RPC, read from the
request), the console in ``tidelog.console.app`` (one per page and action). Both pass every call
through one :class:`Guard` before serving it: the guard names the caller (an identity from the
connection's credentials, never from a request field; :data:`ANONYMOUS` when there are none) and
asks its :class:`Policy` about each access. The policy is :data:`ALLOW_ALL` until an ACL is
configured (``tidelog.security.acl``).

Invariants:

- a call is served only after ``Guard.check`` accepted every access it names; a request stream is
  checked frame by frame (each frame can name another stream);
- a listing (all streams, groups, views, sites) is open to every identified caller and shows only
  what :meth:`Caller.may_see` accepts: :data:`Operation.DESCRIBE` on the item, which any grant on
  that item implies;
- while a call is served, :func:`caller` names who made it, so that what the server owns on a
  caller's behalf (a producer id, a group membership) is bound to that identity.
"""

from __future__ import annotations

import contextvars
import enum
from dataclasses import dataclass
from typing import Final, Protocol

from tidelog.errors import PermissionDenied


class Operation(enum.StrEnum):
    """What a call does: the operations an ACL grants or denies (``docs/security.md``). Kept
    few, as Kafka's are; each is a permission an operator grants or withholds."""

    PUBLISH = "publish"
    """Append messages to a stream (or to the streams of a subject)."""
    SUBSCRIBE = "subscribe"
    """Read messages of a stream, and the views and windows derived from them."""
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    """Pause a stream or make it read-only."""
    CURSOR = "cursor"
    """Read or write a cursor."""
    GROUP = "group"
    """Join, leave or coordinate a consumer group, read its assignments and positions."""
    VIEW = "view"
    """Declare or drop a view of a stream."""
    SITE = "site"
    """Manage remote sites: declare, remove, resync, transmit, status."""
    REPLICATE = "replicate"
    """Send a site's entries to this one (the source site's own identity)."""
    CLUSTER = "cluster"
    """Inter-broker calls: a follower's fetch, the controller's calls, forwarded requests."""
    ADMIN = "admin"
    """Operate the cluster: its status, reassignment."""
    DESCRIBE = "describe"
    """See that a resource exists and its metadata; implied by any other grant on it."""


class Kind(enum.StrEnum):
    """What kind of thing a resource is."""

    STREAM = "stream"
    SUBJECT = "subject"
    GROUP = "group"
    CURSOR = "cursor"
    SITE = "site"
    CLUSTER = "cluster"


ANY: Final = "*"
"""A resource name meaning every resource of its kind (``FetchMetadata`` of all streams)."""


@dataclass(frozen=True, slots=True)
class Resource:
    kind: Kind
    name: str = ANY

    def __str__(self) -> str:
        if self.kind is Kind.CLUSTER:
            return "the cluster"
        return f"{self.kind} {self.name!r}" if self.name != ANY else f"every {self.kind}"


@dataclass(frozen=True, slots=True)
class Access:
    """One operation on one resource."""

    operation: Operation
    resource: Resource

    def __str__(self) -> str:
        return f"{self.operation} on {self.resource}"


def on(operation: Operation, kind: Kind, name: str = ANY) -> Access:
    return Access(operation, Resource(kind, name or ANY))


GROUP_CURSOR_PREFIX: Final = "__group:"
"""A cursor named ``__group:<group id>`` holds that group's positions (docs/api.md)."""


def cursor_access(cursor_id: str) -> Access:
    """What reading or writing the cursor ``cursor_id`` needs, and whose it is: a group's
    positions (:data:`GROUP_CURSOR_PREFIX`) are the group's, so ``group`` on the group (a grant
    of every cursor does not move another group's positions); any other cursor, ``cursor`` on
    it. Every front asks this one rule, for a call on the cursor and for showing it in a listing
    (:meth:`Caller.may_see` of its resource)."""
    if cursor_id.startswith(GROUP_CURSOR_PREFIX):
        return on(Operation.GROUP, Kind.GROUP, cursor_id.removeprefix(GROUP_CURSOR_PREFIX))
    return on(Operation.CURSOR, Kind.CURSOR, cursor_id)


ANONYMOUS: Final = ""
"""The identity of a caller that presented no credentials."""


class Policy(Protocol):
    def allows(self, identity: str, access: Access) -> bool:
        """Whether ``identity`` (:data:`ANONYMOUS` when none) may do ``access``. For
        :data:`Operation.DESCRIBE`, whether any grant on the resource lets it see it."""
        ...


class AllowAll:
    """Every identity may do everything: the policy while no ACL is configured."""

    def allows(self, identity: str, access: Access) -> bool:
        return True


ALLOW_ALL: Final = AllowAll()


class Guard:
    """The one check every call of every front passes (module docstring). ``policy`` may be
    replaced while calls run (a reload): each check reads it once."""

    def __init__(self, policy: Policy = ALLOW_ALL) -> None:
        self.policy = policy

    def check(self, identity: str, accesses: tuple[Access, ...]) -> None:
        """Raise :class:`PermissionDenied` unless ``identity`` may do every access. The message
        names the operation and the resource, never the policy."""
        policy = self.policy
        for access in accesses:
            if not policy.allows(identity, access):
                who = identity or "an anonymous caller"
                raise PermissionDenied(f"{who} may not {access}")

    def may_see(self, identity: str, resource: Resource) -> bool:
        return self.policy.allows(identity, Access(Operation.DESCRIBE, resource))


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes the call being served, and the guard that admitted it."""

    identity: str
    guard: Guard

    def may_see(self, kind: Kind, name: str) -> bool:
        """Whether a listing shows this caller the resource (module docstring)."""
        return self.guard.may_see(self.identity, Resource(kind, name))

    def may(self, operation: Operation, kind: Kind, name: str) -> bool:
        return self.guard.policy.allows(self.identity, on(operation, kind, name))

    def check(self, *accesses: Access) -> None:
        """A check the front makes once it knows more than the request said (the streams a
        subject names, say): :class:`PermissionDenied` as the guard's."""
        self.guard.check(self.identity, accesses)


_OPEN: Final = Caller(ANONYMOUS, Guard())
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("tidelog_caller", default=_OPEN)


def caller() -> Caller:
    """The caller of the call being served (set by the front's guard for the call's task); an
    anonymous caller that may do everything outside any call (tests, in-process use)."""
    return _CALLER.get()


def serving(who: Caller) -> contextvars.Token[Caller]:
    """Name ``who`` as the caller for the rest of the current task (the guard does, per call)."""
    return _CALLER.set(who)
