"""Security: who a caller is (certificates, tokens), what it may do (the ACL), and the TLS
material of servers and clients. ``docs/security.md`` describes the model.

The parts, each with its own invariant: ``identity.py`` (the caller's principal from its
connection), ``tokens.py`` (bearer tokens stored hashed), ``acl.py`` (the ACL file and its
decisions), ``tls.py`` (server credentials reloaded on SIGHUP, client channels).
"""

from tidelog.security.acl import Acl, AclError, load_acl, parse_acl
from tidelog.security.identity import Authenticator, PrincipalRule, RuleError, is_secure
from tidelog.security.tls import (
    PLAINTEXT,
    ClientTls,
    ServerTls,
    TlsError,
    TlsFiles,
    aio_channel,
    channel_credentials,
)
from tidelog.security.tokens import TokensError, TokenStore, add_token, load_tokens

__all__ = [
    "PLAINTEXT",
    "Acl",
    "AclError",
    "Authenticator",
    "ClientTls",
    "PrincipalRule",
    "RuleError",
    "ServerTls",
    "TlsError",
    "TlsFiles",
    "TokenStore",
    "TokensError",
    "add_token",
    "aio_channel",
    "channel_credentials",
    "is_secure",
    "load_acl",
    "load_tokens",
    "parse_acl",
]
