"""The ACL's decisions (deny wins, prefixes, groups, super-users, '*' and anonymous, describe
implied by any grant) and its refusal of files it does not understand."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tidelog.access import ANONYMOUS, Kind, Operation, on
from tidelog.security.acl import Acl, AclError, load_acl, parse_acl

Op = Operation

ACL = """
super_users = ["root"]

[groups]
ops = ["bob", "carol"]

[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["publish", "subscribe"]
resources = ["stream:orders", "stream:logs.*"]

[[rule]]
effect = "deny"
principals = ["alice"]
operations = ["publish"]
resources = ["stream:logs.audit"]

[[rule]]
effect = "allow"
principals = ["group:ops"]
operations = ["*"]
resources = ["stream:*", "cluster"]

[[rule]]
effect = "deny"
principals = ["carol"]
operations = ["delete"]
resources = ["*"]

[[rule]]
effect = "allow"
principals = ["*"]
operations = ["subscribe"]
resources = ["stream:public"]

[[rule]]
effect = "allow"
principals = ["anonymous"]
operations = ["subscribe"]
resources = ["stream:open"]

[[rule]]
effect = "deny"
principals = ["dave"]
operations = ["describe"]
resources = ["stream:secret"]

[[rule]]
effect = "allow"
principals = ["dave"]
operations = ["cursor"]
resources = ["stream:secret", "cursor:dave.*"]
"""


@pytest.fixture(scope="module")
def acl() -> Acl:
    return parse_acl(tomllib.loads(ACL))


CASES = [
    # (who, operation, kind, name, allowed)
    ("alice", Op.PUBLISH, Kind.STREAM, "orders", True),
    ("alice", Op.SUBSCRIBE, Kind.STREAM, "orders", True),
    ("alice", Op.DELETE, Kind.STREAM, "orders", False),  # not granted
    ("alice", Op.PUBLISH, Kind.STREAM, "orders2", False),  # a literal is not a prefix
    ("alice", Op.PUBLISH, Kind.STREAM, "logs.web", True),  # a prefix
    ("alice", Op.PUBLISH, Kind.STREAM, "logs", False),  # "logs.*" needs the dot
    ("alice", Op.PUBLISH, Kind.STREAM, "logs.audit", False),  # deny wins over the prefix
    ("alice", Op.SUBSCRIBE, Kind.STREAM, "logs.audit", True),  # the deny names publish only
    ("alice", Op.PUBLISH, Kind.SUBJECT, "orders", False),  # another kind
    ("bob", Op.DELETE, Kind.STREAM, "anything", True),  # a group's grant
    ("bob", Op.ADMIN, Kind.CLUSTER, "*", True),
    ("bob", Op.GROUP, Kind.GROUP, "g", False),  # the group's grant names streams
    ("carol", Op.PUBLISH, Kind.STREAM, "x", True),
    ("carol", Op.DELETE, Kind.STREAM, "x", False),  # her own deny beats the group's allow
    ("root", Op.DELETE, Kind.STREAM, "logs.audit", True),  # a super-user, whatever the rules
    ("root", Op.SITE, Kind.SITE, "east", True),
    ("mallory", Op.SUBSCRIBE, Kind.STREAM, "public", True),  # "*": every caller
    ("mallory", Op.SUBSCRIBE, Kind.STREAM, "orders", False),  # nothing matching: denied
    (ANONYMOUS, Op.SUBSCRIBE, Kind.STREAM, "public", True),  # "*" includes anonymous
    (ANONYMOUS, Op.SUBSCRIBE, Kind.STREAM, "open", True),
    ("mallory", Op.SUBSCRIBE, Kind.STREAM, "open", False),  # "anonymous" is only anonymous
    (ANONYMOUS, Op.PUBLISH, Kind.STREAM, "public", False),
    ("anonymous", Op.SUBSCRIBE, Kind.STREAM, "open", True),  # how rules name it
    # describe: implied by any grant on the resource, refused only by a deny of describe
    ("alice", Op.DESCRIBE, Kind.STREAM, "orders", True),
    ("alice", Op.DESCRIBE, Kind.STREAM, "logs.audit", True),
    ("alice", Op.DESCRIBE, Kind.STREAM, "elsewhere", False),
    ("mallory", Op.DESCRIBE, Kind.STREAM, "public", True),
    ("dave", Op.CURSOR, Kind.STREAM, "secret", True),
    ("dave", Op.DESCRIBE, Kind.STREAM, "secret", False),
    ("dave", Op.DESCRIBE, Kind.CURSOR, "dave.c", True),
    # a question about every resource of a kind: only a pattern covering every name answers it
    ("bob", Op.DESCRIBE, Kind.STREAM, "*", True),
    ("alice", Op.DESCRIBE, Kind.STREAM, "*", False),
]


@pytest.mark.parametrize(("who", "operation", "kind", "name", "allowed"), CASES)
def test_decisions(
    acl: Acl, who: str, operation: Operation, kind: Kind, name: str, allowed: bool
) -> None:
    assert acl.allows(who, on(operation, kind, name)) is allowed


def test_anonymous_is_never_a_super_user() -> None:
    acl = parse_acl({"super_users": ["anonymous"]})
    assert not acl.allows(ANONYMOUS, on(Op.DELETE, Kind.STREAM, "s"))


def test_an_empty_acl_denies_everything() -> None:
    acl = parse_acl({})
    assert not acl.allows("alice", on(Op.SUBSCRIBE, Kind.STREAM, "s"))
    assert not acl.allows("alice", on(Op.DESCRIBE, Kind.STREAM, "s"))


RULE = {"effect": "allow", "principals": ["a"], "operations": ["publish"], "resources": ["*"]}

BAD = [
    ({"superusers": ["a"]}, "the ACL: unknown key(s) superusers"),
    ({"super_users": "admin"}, "super_users must be a non-empty list of strings"),
    ({"groups": {"ops": []}}, "group 'ops': its members must be a non-empty list"),
    ({"rule": [{**RULE, "effect": "permit"}]}, "rule 1: effect must be 'allow' or 'deny'"),
    ({"rule": [RULE, {**RULE, "operations": ["publsh"]}]}, "rule 2: unknown operation 'publsh'"),
    ({"rule": [{**RULE, "principals": []}]}, "rule 1: principals must be a non-empty list"),
    ({"rule": [{**RULE, "principals": ["group:ops"]}]}, "rule 1: 'group:ops' names a group"),
    ({"rule": [{**RULE, "resources": ["topic:x"]}]}, "rule 1: resource 'topic:x' is not KIND:NAME"),
    ({"rule": [{**RULE, "resources": ["stream:"]}]}, "rule 1: resource 'stream:' names nothing"),
    ({"rule": [{**RULE, "resources": ["stream:a*b"]}]}, "rule 1: resource 'stream:a*b': '*' may"),
    ({"rule": [{**RULE, "resource": ["*"]}]}, "rule 1: unknown key(s) resource"),
    ({"rule": [RULE, RULE, {**RULE, "resources": "*"}]}, "rule 3: resources must be a non-empty"),
]


@pytest.mark.parametrize(("document", "message"), BAD)
def test_a_file_it_does_not_understand_is_refused_naming_the_rule_and_field(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(AclError) as refused:
        parse_acl(document)
    assert message in str(refused.value)


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\neffect = "allow"\nprincipals = ["a"]\n', encoding="utf-8")
    with pytest.raises(AclError, match=f"{path}: rule 1: operations must be"):
        load_acl(path)
    path.write_text("[[rule]\n", encoding="utf-8")
    with pytest.raises(AclError, match=f"{path}: not a TOML file"):
        load_acl(path)
    with pytest.raises(AclError, match="cannot read the ACL file"):
        load_acl(tmp_path / "missing.toml")
    path.write_text(ACL, encoding="utf-8")
    assert load_acl(path).allows("alice", on(Op.PUBLISH, Kind.STREAM, "orders"))


def test_a_principal_named_like_a_group_or_everyone_is_only_itself() -> None:
    """A certificate's first SAN can be a URI such as ``group:ops``, and a token's principal may
    contain ':': neither may take the rules written for the group (or for one named "*")."""
    acl = parse_acl(tomllib.loads(ACL))
    assert acl.allows("bob", on(Op.DELETE, Kind.STREAM, "x"))  # bob is in group:ops
    assert not acl.allows("group:ops", on(Op.DELETE, Kind.STREAM, "x"))
    assert not acl.allows("group:ops", on(Op.DESCRIBE, Kind.STREAM, "x"))
    assert acl.allows("group:ops", on(Op.SUBSCRIBE, Kind.STREAM, "public"))  # still a caller
    literal = parse_acl(
        {
            "rule": [
                {
                    "effect": "allow",
                    "principals": ["*"],
                    "operations": ["subscribe"],
                    "resources": ["stream:open"],
                }
            ]
        }
    )
    assert literal.allows("*", on(Op.SUBSCRIBE, Kind.STREAM, "open"))
    assert not literal.allows("*", on(Op.PUBLISH, Kind.STREAM, "open"))


def test_internal_streams_are_reached_only_by_patterns_that_name_them() -> None:
    acl = parse_acl(
        tomllib.loads(
            """
[[rule]]
effect = "allow"
principals = ["reports"]
operations = ["subscribe"]
resources = ["stream:*"]

[[rule]]
effect = "allow"
principals = ["everything"]
operations = ["*"]
resources = ["*"]

[[rule]]
effect = "allow"
principals = ["auditor"]
operations = ["subscribe"]
resources = ["stream:__cursors"]
"""
        )
    )
    # __cursors holds every cursor and group position, __lrq_* the sites' entries: "*" and
    # "stream:*" grant ordinary streams only.
    for who in ("reports", "everything"):
        assert acl.allows(who, on(Op.SUBSCRIBE, Kind.STREAM, "orders"))
        assert not acl.allows(who, on(Op.SUBSCRIBE, Kind.STREAM, "__cursors"))
        assert not acl.allows(who, on(Op.SUBSCRIBE, Kind.STREAM, "__lrq_delta"))
        assert not acl.allows(who, on(Op.DESCRIBE, Kind.STREAM, "__cursors"))
    assert acl.allows("auditor", on(Op.SUBSCRIBE, Kind.STREAM, "__cursors"))
    assert not acl.allows("auditor", on(Op.SUBSCRIBE, Kind.STREAM, "__lrq_delta"))
