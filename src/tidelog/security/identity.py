"""Who is calling: a principal from the connection's client certificate or a bearer token.

The order, for each call (:meth:`Authenticator.identify`):

1. a bearer token in the call's ``authorization`` metadata: refused on a plaintext connection
   (the token would have crossed the network readable; the message says so) and when unknown;
   otherwise its principal (``tokens.py``);
2. else a verified client certificate (mutual TLS): its first subject alternative name, else its
   common name, rewritten by the first :class:`PrincipalRule` that matches it;
3. else :data:`~tidelog.access.ANONYMOUS`, refused when the server requires credentials.

Nothing in a request's fields is an identity: a follower id, a source site or a producer id is a
claim the front checks against this principal.

Pure: it takes grpc's auth context and metadata as plain mappings, so it is tested without a
server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tidelog.access import ANONYMOUS
from tidelog.errors import Unauthenticated
from tidelog.security.tokens import TokenStore

AUTHORIZATION: Final = "authorization"
OTHER_SAN: Final = "other types of SAN"
"""What grpc lists for a subject alternative name that is not DNS, email, URI or IP (a DirName,
an otherName such as a UPN): never a name, else every such certificate would share it."""
BEARER: Final = "bearer "


class RuleError(ValueError):
    """A principal rule that cannot be used."""


@dataclass(frozen=True, slots=True)
class PrincipalRule:
    """``PATTERN => REPLACEMENT``: a name the whole regular expression matches becomes the
    replacement (``\\1`` and ``\\g<name>`` refer to its groups), as Kafka's
    ``ssl.principal.mapping.rules`` do for distinguished names."""

    pattern: re.Pattern[str]
    replacement: str

    @classmethod
    def parse(cls, text: str) -> PrincipalRule:
        source, sep, replacement = text.partition(" => ")
        if not sep:
            raise RuleError(f"principal rule {text!r} is not 'PATTERN => REPLACEMENT'")
        try:
            pattern = re.compile(source)
        except re.error as error:
            raise RuleError(f"principal rule {text!r}: {error}") from None
        replacement = replacement.strip()
        try:  # a reference to a group the pattern lacks fails here, not on every call
            _check_references(pattern, replacement)
        except (re.error, IndexError) as error:
            raise RuleError(f"principal rule {text!r}: {error}") from None
        return cls(pattern, replacement)

    def apply(self, name: str) -> str | None:
        found = self.pattern.fullmatch(name)
        return found.expand(self.replacement) if found else None


def _check_references(pattern: re.Pattern[str], replacement: str) -> None:
    """Raise ``re.error``/``IndexError`` when ``replacement`` refers to a group ``pattern`` does
    not have (expanding it on a match with every group present, empty)."""
    groups = "".join(f"(?P<{name}>)" for name in pattern.groupindex)
    numbered = pattern.groups - len(pattern.groupindex)
    probe = re.compile(groups + "()" * numbered)
    found = probe.fullmatch("")
    assert found is not None
    # The probe's groups are numbered in another order than the pattern's; only their count
    # and names matter to what a replacement may refer to.
    if pattern.groups != probe.groups:
        raise re.error("internal: could not mirror the pattern's groups")
    found.expand(replacement)


def map_name(name: str, rules: Sequence[PrincipalRule]) -> str:
    """``name`` rewritten by the first rule matching it; unchanged when none does."""
    for rule in rules:
        mapped = rule.apply(name)
        if mapped is not None:
            return mapped
    return name


def certificate_name(auth_context: Mapping[str, Iterable[bytes]]) -> str | None:
    """The verified client certificate's first subject alternative name of a kind grpc writes
    out (DNS, email, URI, IP), else its common name; None without a verified certificate."""
    for key in ("x509_subject_alternative_name", "x509_common_name"):
        for value in auth_context.get(key, ()):
            text = value.decode(errors="replace").strip()
            if text and text != OTHER_SAN:
                return text
    return None


def is_secure(auth_context: Mapping[str, Iterable[bytes]]) -> bool:
    return b"ssl" in tuple(auth_context.get("transport_security_type", ()))


@dataclass(frozen=True, slots=True)
class Authenticator:
    """Names the caller of each call (module docstring). Immutable: a reload swaps it whole."""

    tokens: TokenStore | None = None
    """Where tokens are checked; None: tokens are not accepted."""
    rules: tuple[PrincipalRule, ...] = ()
    required: bool = False
    """Refuse callers without credentials (``UNAUTHENTICATED``) rather than name them
    :data:`~tidelog.access.ANONYMOUS`."""

    def identify(
        self,
        auth_context: Mapping[str, Iterable[bytes]],
        metadata: Iterable[tuple[str, str | bytes]] | None,
    ) -> str:
        token = _bearer(metadata or ())
        if token is not None:
            if not is_secure(auth_context):
                raise Unauthenticated(
                    "a bearer token is refused on a plaintext connection: it crossed the network "
                    "readable (rotate it if the network is not yours); connect with TLS "
                    "(--tls-ca) to a server with TLS on"
                )
            if self.tokens is None:
                raise Unauthenticated("this server accepts no tokens (it has no tokens_file)")
            principal = self.tokens.principal_of(token)
            if principal is None:
                raise Unauthenticated("unknown token (revoked, mistyped, or for another server)")
            return principal
        name = certificate_name(auth_context)
        if name is not None:
            return map_name(name, self.rules)
        if self.required:
            raise Unauthenticated(
                "this server requires credentials: a client certificate (--tls-cert, --tls-key) "
                "or a token (--token)"
            )
        return ANONYMOUS


def _bearer(metadata: Iterable[tuple[str, str | bytes]]) -> str | None:
    for key, value in metadata:
        if key.lower() != AUTHORIZATION:
            continue
        text = value.decode(errors="replace") if isinstance(value, bytes) else value
        if text[: len(BEARER)].lower() != BEARER:
            raise Unauthenticated("the authorization metadata is not 'Bearer <token>'")
        return text[len(BEARER) :].strip()
    return None
