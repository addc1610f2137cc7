"""SCRAM-SHA-256 (RFC 5802, RFC 7677): the keys a server stores, and the server's side of one
exchange, without I/O.

What is stored per credential, from a password, a salt and an iteration count::

    SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
    StoredKey      = SHA-256(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

Neither key gives the password back. A holder of both could pass as the client only by also
reading one exchange of it (a TLS connection hides those), so the file that keeps them stays
``0600`` as the token hashes do.

The exchange, server side (:class:`ScramExchange`), in two steps:

1. client-first ``GS2-HEADER n=USER,r=CNONCE`` -> server-first ``r=CNONCE+SNONCE,s=SALT,i=N``;
2. client-final ``c=B64(GS2-HEADER),r=CNONCE+SNONCE,p=PROOF`` -> server-final ``v=SIGNATURE``,
   once the proof verifies: ``ClientKey = PROOF xor HMAC(StoredKey, AuthMessage)`` and
   ``SHA-256(ClientKey) == StoredKey``, compared in constant time. ``AuthMessage`` is
   client-first-bare, server-first and client-final without its proof, joined by commas.

A user may hold several credentials (one per token, so that tokens rotate without a gap): they
share the user's salt and iteration count, so that one server-first message serves them all, and
the proof is tried against each StoredKey. A user without credentials is answered with a salt
derived from its name and a secret of this process, so that the first step looks the same
whether the user exists or not; its proof never verifies.

Refused, each with :class:`ScramFailure` naming what: channel binding (``p=``; the server offers
none), an authorization identity other than the user, a mandatory extension (``m=``), Kafka's
``tokenauth`` extension (delegation tokens), a nonce or a channel-binding echo that is not the
one of this exchange, a step out of order. An exchange that failed stays failed.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

MECHANISM: Final = "SCRAM-SHA-256"
ITERATIONS: Final = 4096
"""RFC 7677's minimum. The passwords are tidelog tokens (256 random bits), which no iteration
count makes easier or harder to guess; the count only costs each client a PBKDF2 per login."""
SALT_BYTES: Final = 16
_KEY_BYTES: Final = 32
_PROCESS_SECRET: Final = secrets.token_bytes(32)
"""Keys the salts invented for unknown users: stable for a process, unknowable outside it."""
INVALID_CREDENTIALS: Final = "wrong user name or password (token)"


class ScramFailure(Exception):
    """A SCRAM message that is malformed or out of order, or a proof that does not verify; the
    message says which, never anything about a stored key."""


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ScramFailure(f"{what} is not base64") from None


@dataclass(frozen=True, slots=True)
class ScramKeys:
    """One credential's StoredKey and ServerKey (module docstring)."""

    stored_key: bytes
    server_key: bytes


def derive(password: str, salt: bytes, iterations: int) -> ScramKeys:
    """The keys a server stores for ``password`` (module docstring). Tokens are ASCII, for which
    SASLprep changes nothing."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    client_key = _hmac(salted, b"Client Key")
    return ScramKeys(hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key"))


@dataclass(frozen=True, slots=True)
class ScramUser:
    """A user's SCRAM credentials: one salt and iteration count, keys by the token hash each
    was derived from (``sha256:…``, as in the tokens file)."""

    salt: bytes
    iterations: int
    keys: Mapping[str, ScramKeys]


class _Step(enum.Enum):
    FIRST = "expecting client-first"
    FINAL = "expecting client-final"
    DONE = "done"
    FAILED = "failed"


def _decode_name(text: str) -> str:
    # RFC 5802 §5.1: "," and "=" in a name travel as "=2C" and "=3D"; any other "=" is an error.
    parts = text.split("=")
    out = [parts[0]]
    for part in parts[1:]:
        if part.startswith("2C"):
            out.append("," + part[2:])
        elif part.startswith("3D"):
            out.append("=" + part[2:])
        else:
            raise ScramFailure("the user name has an '=' that is not =2C or =3D")
    return "".join(out)


def _valid_nonce(nonce: str) -> bool:
    return bool(nonce) and all("!" <= c <= "~" and c != "," for c in nonce)


class ScramExchange:
    """The server's side of one SCRAM-SHA-256 exchange (module docstring). ``users`` maps user
    names to their credentials; after :meth:`final`, :attr:`user` and :attr:`digest` name who
    logged in and with which token's credential."""

    def __init__(self, users: Mapping[str, ScramUser], *, server_nonce: str | None = None):
        self._users = users
        self._server_nonce = server_nonce or secrets.token_urlsafe(24)
        self._step = _Step.FIRST
        self._gs2_header = ""
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._found: ScramUser | None = None
        self.user = ""
        self.digest = ""

    @property
    def done(self) -> bool:
        return self._step is _Step.DONE

    def first(self, message: bytes) -> bytes:
        """The server-first message answering ``message`` (client-first)."""
        self._expect(_Step.FIRST)
        try:
            text = message.decode("utf-8")
            cbind, authzid, bare = text.split(",", 2)
        except (UnicodeDecodeError, ValueError):
            raise self._failure("the client-first message is not 'n,,n=USER,r=NONCE'") from None
        if cbind.startswith("p="):
            raise self._failure("channel binding is not offered (use SCRAM-SHA-256, not -PLUS)")
        if cbind not in ("n", "y"):
            raise self._failure(f"unknown channel-binding flag {cbind!r}")
        attributes = bare.split(",")
        if attributes[0].startswith("m="):
            raise self._failure("a mandatory extension (m=) is not supported")
        if len(attributes) < 2 or not attributes[0].startswith("n="):
            raise self._failure("the client-first message has no n=USER")
        if not attributes[1].startswith("r=") or not _valid_nonce(attributes[1][2:]):
            raise self._failure("the client-first message has no valid nonce r=")
        try:
            user = _decode_name(attributes[0][2:])
            other = authzid and (not authzid.startswith("a=") or _decode_name(authzid[2:]) != user)
        except ScramFailure as failure:
            raise self._failure(str(failure)) from None
        if other:
            raise self._failure("an authorization identity other than the user is not supported")
        for extension in attributes[2:]:
            name, is_pair, _value = extension.partition("=")
            if not is_pair or not name.isalpha():
                raise self._failure(f"an extension that is not NAME=VALUE: {extension[:20]!r}")
            if name == "tokenauth":
                raise self._failure("delegation tokens (tokenauth) are not supported")
        found = self._users.get(user)
        if found is None:
            salt = _hmac(_PROCESS_SECRET, b"salt\0" + user.encode())[:SALT_BYTES]
            found = ScramUser(salt, ITERATIONS, {})
        self.user, self._found = user, found
        self._gs2_header = f"{cbind},{authzid},"
        self._first_bare = bare
        self._nonce = attributes[1][2:] + self._server_nonce
        self._server_first = f"r={self._nonce},s={b64(found.salt)},i={found.iterations}"
        self._step = _Step.FINAL
        return self._server_first.encode()

    def final(self, message: bytes) -> bytes:
        """The server-final message answering ``message`` (client-final) when its proof
        verifies; :class:`ScramFailure` otherwise."""
        self._expect(_Step.FINAL)
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            raise self._failure("the client-final message is not UTF-8") from None
        without_proof, found_proof, proof_text = text.rpartition(",p=")
        attributes = without_proof.split(",")
        if not found_proof or len(attributes) < 2:
            raise self._failure("the client-final message is not 'c=…,r=…,p=…'")
        if attributes[0] != "c=" + b64(self._gs2_header.encode()):
            raise self._failure("the channel-binding echo (c=) is not the client-first's header")
        if attributes[1] != "r=" + self._nonce:
            raise self._failure("the nonce (r=) is not this exchange's")
        try:
            proof = unb64(proof_text, "the proof")
        except ScramFailure as failure:
            raise self._failure(str(failure)) from None
        if len(proof) != _KEY_BYTES:
            raise self._failure("the proof is not 32 bytes")
        auth_message = f"{self._first_bare},{self._server_first},{without_proof}".encode()
        assert self._found is not None
        for digest, keys in self._found.keys.items():
            signature = _hmac(keys.stored_key, auth_message)
            client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
            if hmac.compare_digest(hashlib.sha256(client_key).digest(), keys.stored_key):
                self.digest = digest
                self._step = _Step.DONE
                return ("v=" + b64(_hmac(keys.server_key, auth_message))).encode()
        raise self._failure(INVALID_CREDENTIALS)

    def _expect(self, step: _Step) -> None:
        if self._step is not step:
            was = self._step
            self._step = _Step.FAILED
            raise ScramFailure(f"a SCRAM message out of order ({was.value})")

    def _failure(self, reason: str) -> ScramFailure:
        self._step = _Step.FAILED
        return ScramFailure(reason)
