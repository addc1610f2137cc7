"""The server's security settings put to work: its TLS material, the :class:`~tidelog.api.guard.
Door` every call passes (authenticator and ACL), reloaded together on SIGHUP.

A reload reads the certificate, the tokens file and the ACL again. Each part that cannot be used
is refused with one log line naming the file and the problem, and the server keeps what it had
for that part; the others are applied. Nothing of a reload ever stops the server. Then the
connections already open are asked again: the gRPC calls (``open_calls.py``) and whatever else
registered in :attr:`ServerSecurity.rechecks` (the Kafka listener's SASL logins).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Callable

from tidelog.access import ALLOW_ALL, Guard, Policy
from tidelog.api.guard import Door
from tidelog.api.settings import ServerSettings
from tidelog.security import (
    PLAINTEXT,
    AclError,
    Authenticator,
    ClientTls,
    PrincipalRule,
    ServerTls,
    TlsError,
    TlsFiles,
    TokensError,
    TokenStore,
    load_acl,
    load_tokens,
)
from tidelog.security.tokens import digest, new_token

LOG = logging.getLogger("tidelog.security")


class ServerSecurity:
    """Built once from the settings (raising on anything unusable: a server does not start
    half-secured), then :meth:`reload`-ed on SIGHUP."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.tls: ServerTls | None = None
        if settings.tls_cert is not None and settings.tls_key is not None:
            self.tls = ServerTls(
                TlsFiles(settings.tls_cert, settings.tls_key, settings.tls_client_ca)
            )
        self.rules = tuple(PrincipalRule.parse(rule) for rule in settings.principal_rules)
        self._own_tokens: dict[str, str] = {}
        """digest -> principal: tokens this process made for its own clients (the console's,
        :meth:`own_token`), accepted beside the tokens file's and kept across reloads."""
        self.door = Door(Guard(self._policy()), self._authenticator(self._tokens()))
        self.rechecks: list[Callable[[], int]] = []
        """Asked after each reload of the tokens or the ACL, as the door's open calls are: each
        ends the connections the new ones refuse (logging each) and returns how many."""

    def _tokens(self) -> TokenStore | None:
        path = self.settings.tokens_file
        return load_tokens(path) if path is not None else None

    def _policy(self) -> Policy:
        path = self.settings.acl_file
        return load_acl(path) if path is not None else ALLOW_ALL

    def _authenticator(self, tokens: TokenStore | None) -> Authenticator:
        if tokens is not None and self._own_tokens:
            tokens = dataclasses.replace(
                tokens, principals={**tokens.principals, **self._own_tokens}
            )
        return Authenticator(tokens, self.rules, self.settings.authentication_required)

    def own_token(self, principal: str) -> str | None:
        """A token for ``principal`` that a client in this very process (the console) presents
        to the gRPC port, when the server takes tokens (None otherwise). It lives in memory
        only, for as long as the server runs, and survives reloads of the tokens file."""
        authenticator = self.door.authenticator
        if authenticator.tokens is None:
            return None
        token = new_token()
        self._own_tokens[digest(token)] = principal
        tokens = dataclasses.replace(
            authenticator.tokens, principals={**authenticator.tokens.principals, **self._own_tokens}
        )
        self.door.authenticator = dataclasses.replace(authenticator, tokens=tokens)
        return token

    def peer_tls(self) -> ClientTls:
        """How this server calls other brokers and sites: its own certificate as the client's,
        their certificates checked against ``tls_ca`` (else ``tls_client_ca``)."""
        settings = self.settings
        if settings.tls_cert is None:
            return PLAINTEXT
        return ClientTls(
            ca=settings.tls_ca or settings.tls_client_ca,
            cert=settings.tls_cert,
            key=settings.tls_key,
            enabled=True,
        )

    def reload(self) -> list[str]:
        """Read every file again (module docstring); returns what was reloaded."""
        done = []
        if self.tls is not None:
            try:
                self.tls.reload()
                done.append("certificates")
            except TlsError as error:
                LOG.error("reload: certificates kept as they were: %s", error)
        if self.settings.tokens_file is not None:
            try:
                self.door.authenticator = self._authenticator(self._tokens())
                done.append("tokens")
            except TokensError as error:
                LOG.error("reload: tokens kept as they were: %s", error)
        if self.settings.acl_file is not None:
            try:
                self.door.guard = Guard(self._policy())
                done.append("ACL")
            except AclError as error:
                LOG.error(
                    "reload: the ACL kept as it was (nothing of the new file applies): %s", error
                )
        LOG.info("reload: %s", ", ".join(done) if done else "nothing to reload")
        if "tokens" in done or "ACL" in done:
            ended = self.door.recheck()
            if ended:
                LOG.warning(
                    "reload: ended %d open call(s) whose caller the new tokens or ACL no longer "
                    "allow (each answered UNAUTHENTICATED or PERMISSION_DENIED)",
                    ended,
                )
            for recheck in self.rechecks:
                recheck()
        return done

    def exposure_warnings(self, host: str) -> list[str]:
        """What a bind to ``host`` exposes, when it is not loopback-only."""
        if _loopback(host):
            return []
        settings, warnings = self.settings, []
        if self.tls is None:
            warnings.append(
                f"listening on {host} without TLS: every message, cursor and token crosses the "
                f"network readable (set tls_cert and tls_key)"
            )
        if settings.acl_file is None:
            # Who gets in decides how bad it is: say it, so that the line is not dismissed.
            if settings.tls_client_ca is not None:
                who = "every client with a certificate from tls_client_ca"
            elif settings.authentication_required:
                who = "every holder of a token"
            else:
                who = "anyone who reaches the port"
            warnings.append(
                f"listening on {host} without an ACL: {who} may read, publish, delete streams "
                f"and move cursors (set acl_file; docs/security.md)"
            )
        elif not settings.authentication_required and settings.tls_client_ca is None:
            warnings.append(
                f"listening on {host} admitting anonymous callers (allow_anonymous): the ACL's "
                f"rules for 'anonymous' and '*' apply to anyone who reaches the port"
            )
        return warnings


def _loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
