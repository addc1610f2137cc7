"""The access-control list: who may do which operation on which resource, read from a TOML file.

The file (``docs/security.md`` has examples)::

    super_users = ["admin"]              # may do everything; no rule is read for them

    [groups]
    ops = ["alice", "bob"]               # named in rules as "group:ops"

    [[rule]]
    effect = "allow"                     # or "deny"
    principals = ["alice", "group:ops"]  # "*": every caller that reaches the policy
    operations = ["publish", "subscribe"]  # or ["*"]
    resources = ["stream:orders", "stream:orders.*", "group:*", "cluster", "*"]

A resource pattern is ``KIND:NAME`` (that one resource), ``KIND:PREFIX*`` (every name that
starts with ``PREFIX``), ``KIND:*`` (every resource of that kind), ``*`` (everything), or
``cluster``. Kinds: stream, subject, group, cursor, site, cluster.

Decisions (:meth:`Acl.allows`), in order: a super-user may; a matching deny refuses; a matching
allow admits; nothing matching refuses. ``describe`` (seeing a resource in a listing, its
metadata) is admitted by any allow on the resource and refused only by a deny of ``describe``.
A request for every resource of a kind (``on(DESCRIBE, STREAM)`` with the name ``*``) matches only
patterns that cover every name of that kind. The broker's internal streams (``__cursors``, the
sites' ``__lrq_*`` queues) are matched only by patterns that name them (``stream:__cursors``,
``stream:__*``), never by ``*`` or ``stream:*``: they hold every cursor, every group's positions
and the sites' entries, which other grants guard.

Parsing is pure (:func:`parse_acl` takes the decoded TOML) and refuses anything it does not
understand with :class:`AclError`, naming the rule and the field: a typo in an operation must not
silently grant or withhold something.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tidelog.access import ANONYMOUS, ANY, Access, Kind, Operation, Resource

EVERYONE: Final = "*"
GROUP_PREFIX: Final = "group:"
INTERNAL_PREFIX: Final = "__"
"""Names of the broker's internal streams (``tidelog.broker``'s ``INTERNAL_PREFIX``)."""
ANONYMOUS_NAME: Final = "anonymous"
"""How rules name a caller without credentials (when the server admits them at all)."""


class AclError(ValueError):
    """An ACL file that cannot be used; the message names the file, the rule and the field."""


@dataclass(frozen=True, slots=True)
class Pattern:
    """A set of resources: one kind (or every kind, ``kind`` None) and a literal or prefix."""

    kind: Kind | None
    name: str
    prefix: bool

    def matches(self, resource: Resource) -> bool:
        if self.kind is not None and self.kind is not resource.kind:
            return False
        if resource.name == ANY:  # a question about every resource of a kind
            return self.prefix and self.name == ""
        # The broker's own streams (cursors, the sites' queues) hold what other grants guard:
        # only a pattern that names them reaches them, never "*" or "stream:*".
        internal = resource.kind is Kind.STREAM and resource.name.startswith(INTERNAL_PREFIX)
        if internal and not self.name.startswith(INTERNAL_PREFIX):
            return False
        return resource.name.startswith(self.name) if self.prefix else resource.name == self.name


@dataclass(frozen=True, slots=True)
class Rule:
    allow: bool
    principals: frozenset[str]
    operations: frozenset[Operation]
    resources: tuple[Pattern, ...]

    def names(self, principals: frozenset[str]) -> bool:
        return not self.principals.isdisjoint(principals)

    def covers(self, resource: Resource) -> bool:
        return any(pattern.matches(resource) for pattern in self.resources)


@dataclass(frozen=True, slots=True)
class Acl:
    """A parsed ACL (module docstring); immutable, so a reload swaps it whole."""

    super_users: frozenset[str]
    groups: Mapping[str, frozenset[str]]
    """principal -> the "group:NAME" names it belongs to"""
    rules: tuple[Rule, ...]

    def allows(self, identity: str, access: Access) -> bool:
        name = identity or ANONYMOUS_NAME
        if identity != ANONYMOUS and name in self.super_users:
            return True
        # A principal is only ever itself: one whose name reads like a group or like "*" (a
        # certificate's URI SAN "group:ops", say) must not take that group's or everyone's rules.
        own = () if name == EVERYONE or name.startswith(GROUP_PREFIX) else (name,)
        who = frozenset({*own, EVERYONE, *self.groups.get(name, ())})
        operation, resource = access.operation, access.resource
        for rule in self.rules:
            denied = not rule.allow and operation in rule.operations
            if denied and rule.names(who) and rule.covers(resource):
                return False
        for rule in self.rules:
            granted = operation in rule.operations or operation is Operation.DESCRIBE
            if rule.allow and granted and rule.names(who) and rule.covers(resource):
                return True
        return False


_KINDS: Final = {kind.value: kind for kind in Kind}
_OPERATIONS: Final = {operation.value: operation for operation in Operation}


def parse_pattern(text: str) -> Pattern:
    """``KIND:NAME``, ``KIND:PREFIX*``, ``KIND:*``, ``*`` or ``cluster`` (module docstring)."""
    if text == "*":
        return Pattern(None, "", True)
    if text == "cluster":
        return Pattern(Kind.CLUSTER, "", True)
    kind_name, sep, name = text.partition(":")
    if not sep or kind_name not in _KINDS:
        raise ValueError(
            f"resource {text!r} is not KIND:NAME with KIND one of {', '.join(_KINDS)} "
            f"(or '*', or 'cluster')"
        )
    if not name:
        raise ValueError(f"resource {text!r} names nothing after the ':' (use {kind_name}:*)")
    if name.endswith("*"):
        return Pattern(_KINDS[kind_name], name[:-1], True)
    if "*" in name:
        raise ValueError(f"resource {text!r}: '*' may only end a name (a prefix)")
    return Pattern(_KINDS[kind_name], name, False)


def _strings(where: str, field: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise AclError(f"{where}: {field} must be a non-empty list of strings, got {value!r}")
    return value


def parse_acl(document: Mapping[str, Any], source: str = "the ACL") -> Acl:
    """An :class:`Acl` from a decoded TOML document; :class:`AclError` names what is wrong."""
    unknown = set(document) - {"super_users", "groups", "rule"}
    if unknown:
        raise AclError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (expected super_users, "
            f"groups, [[rule]])"
        )
    supers = document.get("super_users", [])
    if supers:
        supers = _strings(source, "super_users", supers)
    groups_of: dict[str, set[str]] = {}
    groups = document.get("groups", {})
    if not isinstance(groups, dict):
        raise AclError(f"{source}: [groups] must be a table of name = [principals]")
    for group, members in groups.items():
        for member in _strings(f"{source}: group {group!r}", "its members", members):
            groups_of.setdefault(member, set()).add(f"{GROUP_PREFIX}{group}")
    rules = []
    entries = document.get("rule", [])
    if not isinstance(entries, list):
        raise AclError(f"{source}: rules are written as [[rule]] tables")
    for number, entry in enumerate(entries, 1):
        where = f"{source}: rule {number}"
        if not isinstance(entry, dict):
            raise AclError(f"{where}: not a table")
        extra = set(entry) - {"effect", "principals", "operations", "resources", "comment"}
        if extra:
            raise AclError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
        effect = entry.get("effect")
        if effect not in ("allow", "deny"):
            raise AclError(f"{where}: effect must be 'allow' or 'deny', got {effect!r}")
        principals = _strings(where, "principals", entry.get("principals"))
        for principal in principals:
            if principal.startswith(GROUP_PREFIX) and principal[len(GROUP_PREFIX) :] not in groups:
                raise AclError(f"{where}: {principal!r} names a group [groups] does not define")
        names = _strings(where, "operations", entry.get("operations"))
        operations: set[Operation] = set()
        for name in names:
            if name == "*":
                operations.update(Operation)
            elif name in _OPERATIONS:
                operations.add(_OPERATIONS[name])
            else:
                raise AclError(
                    f"{where}: unknown operation {name!r} (one of {', '.join(_OPERATIONS)}, or *)"
                )
        try:
            patterns = tuple(
                parse_pattern(p) for p in _strings(where, "resources", entry.get("resources"))
            )
        except ValueError as error:
            raise AclError(f"{where}: {error}") from None
        rules.append(
            Rule(effect == "allow", frozenset(principals), frozenset(operations), patterns)
        )
    return Acl(
        frozenset(supers),
        {member: frozenset(names) for member, names in groups_of.items()},
        tuple(rules),
    )


def load_acl(path: Path) -> Acl:
    """The ACL in the TOML file at ``path``; :class:`AclError` for a missing or wrong file."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise AclError(f"{path}: cannot read the ACL file: {error.strerror or error}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise AclError(f"{path}: not a TOML file: {error}") from None
    return parse_acl(document, str(path))


def acl_of(rules: Iterable[Rule], super_users: Iterable[str] = ()) -> Acl:
    """An ACL built in code (tests, embedded use)."""
    return Acl(frozenset(super_users), {}, tuple(rules))
