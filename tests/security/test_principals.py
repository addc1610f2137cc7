"""Who a caller is, from grpc's auth context and the call's metadata: a token (never on
plaintext), else the certificate's first subject alternative name, else its common name, mapped
by the principal rules; without either, anonymous or UNAUTHENTICATED."""

from __future__ import annotations

import pytest

from tidelog.access import ANONYMOUS
from tidelog.errors import Unauthenticated
from tidelog.security.identity import (
    Authenticator,
    PrincipalRule,
    RuleError,
    certificate_name,
    map_name,
)
from tidelog.security.tokens import digest, parse_tokens

TLS = {"transport_security_type": [b"ssl"]}


def certified(*sans: bytes, cn: bytes = b"the-cn") -> dict[str, list[bytes]]:
    context = {**TLS, "x509_common_name": [cn]}
    if sans:
        context["x509_subject_alternative_name"] = list(sans)
    return context


def test_the_first_subject_alternative_name_then_the_common_name() -> None:
    assert certificate_name(certified(b"alice", b"localhost", b"127.0.0.1")) == "alice"
    assert certificate_name(certified()) == "the-cn"
    assert certificate_name(certified(b"  ", b"bob")) == "bob"  # an empty name is skipped
    assert certificate_name(TLS) is None
    assert certificate_name({}) is None


def test_rules_rewrite_the_name_the_first_matching_rule_wins() -> None:
    rules = (
        PrincipalRule.parse(r"CN=([a-z]+),OU=apps => app-\1"),
        PrincipalRule.parse(r"(?P<user>[a-z]+)@example\.com => \g<user>"),
        PrincipalRule.parse(r".*@example\.com => never-reached"),
    )
    assert map_name("CN=billing,OU=apps", rules) == "app-billing"
    assert map_name("alice@example.com", rules) == "alice"
    assert map_name("alice@example.com.evil", rules) == "alice@example.com.evil"  # whole name
    assert map_name("bob", rules) == "bob"  # no rule matches: unchanged
    authenticator = Authenticator(rules=rules)
    assert authenticator.identify(certified(b"alice@example.com"), ()) == "alice"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no arrow", "is not 'PATTERN =>"),
        ("( => x", "missing )"),
        # A replacement naming a group the pattern lacks failed on every matching call, as an
        # INTERNAL error; it is refused when the rule is read.
        (r"CN=(.*) => \2", "invalid group reference 2"),
        (r"(?P<user>.*)@corp => \g<name>", "unknown group name 'name'"),
    ],
)
def test_a_bad_rule_is_refused(text: str, message: str) -> None:
    with pytest.raises(RuleError) as refused:
        PrincipalRule.parse(text)
    assert str(refused.value).startswith(f"principal rule {text!r}")
    assert message in str(refused.value)


def tokens() -> Authenticator:
    store = parse_tokens({"tokens": {"carol": digest("tdl_carol")}})
    return Authenticator(tokens=store, required=True)


def test_a_token_over_tls_is_its_principal_and_wins_over_the_certificate() -> None:
    metadata = [("authorization", "Bearer tdl_carol")]
    assert tokens().identify(TLS, metadata) == "carol"
    assert tokens().identify(certified(b"alice"), metadata) == "carol"
    assert tokens().identify(TLS, [("Authorization", b"bearer tdl_carol")]) == "carol"


def test_a_token_on_plaintext_is_refused_saying_why() -> None:
    for context in ({}, {"transport_security_type": [b"insecure"]}):
        with pytest.raises(Unauthenticated, match="refused on a plaintext connection"):
            tokens().identify(context, [("authorization", "Bearer tdl_carol")])


def test_an_unknown_token_or_a_server_without_tokens_is_unauthenticated() -> None:
    with pytest.raises(Unauthenticated, match="unknown token"):
        tokens().identify(TLS, [("authorization", "Bearer tdl_mallory")])
    with pytest.raises(Unauthenticated, match="accepts no tokens"):
        Authenticator().identify(TLS, [("authorization", "Bearer tdl_carol")])
    with pytest.raises(Unauthenticated, match="not 'Bearer <token>'"):
        tokens().identify(TLS, [("authorization", "Basic dXNlcjpwYXNz")])


def test_without_credentials_anonymous_unless_required() -> None:
    assert Authenticator().identify({}, None) == ANONYMOUS
    assert Authenticator().identify(TLS, [("x-other", "1")]) == ANONYMOUS
    with pytest.raises(Unauthenticated, match="requires credentials"):
        Authenticator(required=True).identify(TLS, ())
    assert Authenticator(required=True).identify(certified(b"alice"), ()) == "alice"


def test_a_san_grpc_cannot_write_out_is_never_the_name() -> None:
    # grpc lists a DirName or otherName SAN as the same placeholder for every certificate.
    context = {
        "transport_security_type": [b"ssl"],
        "x509_subject_alternative_name": [b"other types of SAN", b"bob.example"],
        "x509_common_name": [b"bob"],
    }
    assert certificate_name(context) == "bob.example"
    only_other = {**context, "x509_subject_alternative_name": [b"other types of SAN"]}
    assert certificate_name(only_other) == "bob"
