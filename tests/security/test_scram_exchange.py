"""The server side of SCRAM-SHA-256 (``tidelog.security.scram``) against RFC 7677's example
exchange, and every refusal: a wrong proof, an unknown user (answered like a known one), several
credentials of one user, malformed or out-of-order messages."""

from __future__ import annotations

import base64

import pytest
from tests.security.scram_client import client_final

from tidelog.security.scram import (
    ITERATIONS,
    ScramExchange,
    ScramFailure,
    ScramUser,
    derive,
)

# RFC 7677 section 3
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def user_of(*passwords: str, salt: bytes = SALT) -> ScramUser:
    return ScramUser(
        salt,
        ITERATIONS,
        {f"sha256:{i}": derive(p, salt, ITERATIONS) for i, p in enumerate(passwords)},
    )


def exchange(users: dict[str, ScramUser]) -> ScramExchange:
    return ScramExchange(users, server_nonce=SERVER_NONCE)


def test_the_rfc_7677_exchange() -> None:
    server = exchange({"user": user_of("pencil")})
    assert server.first(CLIENT_FIRST) == SERVER_FIRST
    assert not server.done
    assert server.final(CLIENT_FINAL) == SERVER_FINAL
    assert server.done and server.user == "user" and server.digest == "sha256:0"


def test_a_wrong_password_fails_and_the_exchange_stays_failed() -> None:
    server = exchange({"user": user_of("not pencil")})
    assert server.first(CLIENT_FIRST) == SERVER_FIRST
    with pytest.raises(ScramFailure, match="wrong user name or password"):
        server.final(CLIENT_FINAL)
    with pytest.raises(ScramFailure, match="out of order"):
        server.final(CLIENT_FINAL)


def test_each_credential_of_a_user_logs_in_and_is_named() -> None:
    users = {"alice": user_of("old token", "new token")}
    for index, password in enumerate(("old token", "new token")):
        server = exchange(users)
        first = server.first(b"n,,n=alice,r=abc")
        assert server.final(client_final(password, first, "n=alice,r=abc")).startswith(b"v=")
        assert server.digest == f"sha256:{index}"


def test_an_unknown_user_is_answered_as_a_known_one_and_never_logs_in() -> None:
    server = exchange({})
    first = server.first(b"n,,n=nobody,r=abc")
    fields = dict(part.split("=", 1) for part in first.decode().split(","))
    assert fields["i"] == str(ITERATIONS) and len(base64.b64decode(fields["s"])) == 16
    # the same name gets the same salt each time (else its absence would show)
    assert exchange({}).first(b"n,,n=nobody,r=abc") == first
    with pytest.raises(ScramFailure, match="wrong user name or password"):
        server.final(client_final("anything", first, "n=nobody,r=abc"))


def test_escaped_names_and_an_authzid_naming_the_user() -> None:
    users = {"a,b=c": user_of("pw")}
    server = exchange(users)
    first = server.first(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=abc")
    final = client_final("pw", first, "n=a=2Cb=3Dc,r=abc", header="n,a=a=2Cb=3Dc,")
    assert server.final(final).startswith(b"v=")
    assert server.user == "a,b=c"


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"p=tls-unique,,n=user,r=abc", "channel binding is not offered"),
        (b"x,,n=user,r=abc", "unknown channel-binding flag"),
        (b"n,a=other,n=user,r=abc", "authorization identity other than the user"),
        (b"n,,m=ext,n=user,r=abc", "mandatory extension"),
        (b"n,,n=user,r=abc,tokenauth=true", "delegation tokens"),
        (b"n,,r=abc", "no n=USER"),
        (b"n,,n=user", "no n=USER"),
        (b"n,,n=user,r=a,b", "an extension that is not NAME=VALUE"),
        (b"n,,n=user,r=", "no valid nonce"),
        (b"n,,n=us=er,r=abc", "=2C or =3D"),
        (b"n,,n=user", "no n=USER"),
        (b"garbage", "is not 'n,,n=USER,r=NONCE'"),
        (b"\xff\xfe", "is not 'n,,n=USER,r=NONCE'"),
    ],
)
def test_a_client_first_message_refused(message: bytes, reason: str) -> None:
    server = exchange({"user": user_of("pencil")})
    with pytest.raises(ScramFailure, match=reason):
        server.first(message)
    with pytest.raises(ScramFailure, match="out of order"):
        server.first(CLIENT_FIRST)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (CLIENT_FINAL.replace(b"c=biws", b"c=eSws"), "channel-binding echo"),
        (CLIENT_FINAL.replace(b"hNlF$k0,", b"hNlF$k1,"), "nonce"),
        (CLIENT_FINAL.split(b",p=")[0], "is not 'c="),
        (CLIENT_FINAL.split(b",p=")[0] + b",p=!!!", "not base64"),
        (CLIENT_FINAL.split(b",p=")[0] + b",p=AAAA", "not 32 bytes"),
        (b"\xff", "not UTF-8"),
    ],
)
def test_a_client_final_message_refused(message: bytes, reason: str) -> None:
    server = exchange({"user": user_of("pencil")})
    server.first(CLIENT_FIRST)
    with pytest.raises(ScramFailure, match=reason):
        server.final(message)


def test_a_final_message_before_the_first_is_out_of_order() -> None:
    with pytest.raises(ScramFailure, match="out of order"):
        exchange({}).final(CLIENT_FINAL)
