"""What a call does to what: the operations and resources every front's calls are checked for.

Each front names, for each of its calls, the :class:`Access` it needs (an operation on a
resource): the gRPC services in ``tidelog.api.guard`` (one table entry per RPC, read from the
request), the console in ``tidelog.console.app`` (one per page and action). Both pass every call
through one :class:`Guard` before serving it. Who may do what is the guard's :class:`Policy`;
until identities exist (certificates, tokens) the policy is :data:`ALLOW_ALL`, so the tables are
complete before anything is refused by them.

Invariant: a call is served only after ``Guard.check`` accepted every access it names; a request
stream is checked frame by frame (each frame can name another stream).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Protocol

from tidelog.errors import PermissionDenied


class Operation(enum.StrEnum):
    """What a call does. Kept few, as Kafka's ACL operations are: each is a permission an
    operator grants or withholds."""

    READ = "read"
    """Read messages, cursors, views or a group's assignment."""
    PUBLISH = "publish"
    """Append messages (to a stream, or a site's send queue)."""
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    """Change settings or state: pause, read-only, views, a site's remote sites, reassignment,
    a cursor's offset, a group's membership."""
    DESCRIBE = "describe"
    """Read metadata and status."""
    REPLICATE = "replicate"
    """Take part in replication: a follower's fetch (cluster), another site's transfer."""


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


ANONYMOUS: Final = ""
"""The identity of a caller that presented no credentials."""


class Policy(Protocol):
    def allows(self, identity: str, access: Access) -> bool:
        """Whether ``identity`` (:data:`ANONYMOUS` when none) may do ``access``."""
        ...


class AllowAll:
    """Every identity may do everything: the policy until identities exist."""

    def allows(self, identity: str, access: Access) -> bool:
        return True


ALLOW_ALL: Final = AllowAll()


class Guard:
    """The one check every call of every front passes (module docstring)."""

    def __init__(self, policy: Policy = ALLOW_ALL) -> None:
        self.policy = policy

    def check(self, identity: str, accesses: tuple[Access, ...]) -> None:
        """Raise :class:`PermissionDenied` unless ``identity`` may do every access."""
        for access in accesses:
            if not self.policy.allows(identity, access):
                who = identity or "an anonymous caller"
                raise PermissionDenied(f"{who} may not {access}")
