"""Bearer tokens: random secrets handed to clients, kept by the server only as their SHA-256.

The tokens file (TOML) maps each principal to the hashes of its tokens::

    [tokens]
    alice = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    spark-job = ["sha256:…", "sha256:…"]   # several tokens: rotate without a gap

A token is 32 random bytes (:func:`new_token`), so a fast hash is enough: nothing shorter than
the secret itself can be guessed, and a leaked file reveals no token. ``tidelog token create``
writes an entry and prints the token once.

Kafka clients that log in with SCRAM-SHA-256 prove they know a token without sending it, which
the server checks against keys derived from the token (``scram.py``), not against its hash. So a
token made with ``--scram`` also gets those keys, in a table per principal (one salt and
iteration count per principal, so that one exchange can try each of its tokens)::

    [scram-sha-256.alice]
    salt = "W22ZaJ0SNY7soEsUEjb6gQ=="
    iterations = 4096

    [scram-sha-256.alice.keys]
    "sha256:9f86…" = { stored_key = "…", server_key = "…" }

A key is named by its token's hash and counts only while that hash is in ``[tokens]`` under the
same principal: removing a token's hash revokes it for every mechanism. Files without the
section (written before it existed) read as before.

Invariant: :meth:`TokenStore.principal_of` compares digests, never the secret; the store is
immutable, so a reload (SIGHUP) swaps it whole.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tidelog.security.scram import (
    ITERATIONS,
    SALT_BYTES,
    ScramFailure,
    ScramKeys,
    ScramUser,
    b64,
    derive,
    unb64,
)

PREFIX: Final = "sha256:"
SCRAM_SECTION: Final = "scram-sha-256"
_MIN_SALT_BYTES: Final = 8
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:-]{0,127}$")


class TokensError(ValueError):
    """A tokens file that cannot be used; the message names the file and the entry."""


def digest(token: str) -> str:
    return PREFIX + hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh token: 32 random bytes, URL-safe (43 characters), prefixed so it is recognisable
    in a leaked log or a secret scanner."""
    return "tdl_" + secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class TokenStore:
    principals: Mapping[str, str]
    """digest -> principal"""
    scram: Mapping[str, ScramUser] = field(default_factory=dict)
    """principal -> its SCRAM-SHA-256 credentials, each key's token still in ``principals``"""

    def principal_of(self, token: str) -> str | None:
        """The principal a token stands for, or None for an unknown token."""
        return self.principals.get(digest(token))


def parse_tokens(document: Mapping[str, Any], source: str = "the tokens file") -> TokenStore:
    unknown = set(document) - {"tokens", SCRAM_SECTION}
    if unknown:
        raise TokensError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (expected [tokens], "
            f"[{SCRAM_SECTION}])"
        )
    table = document.get("tokens", {})
    if not isinstance(table, dict):
        raise TokensError(f'{source}: [tokens] must be a table of principal = "sha256:…"')
    principals: dict[str, str] = {}
    for principal, value in table.items():
        if not _PRINCIPAL.match(principal):
            raise TokensError(f"{source}: {principal!r} is not a principal name")
        digests = value if isinstance(value, list) else [value]
        for entry in digests:
            if not isinstance(entry, str) or not _DIGEST.match(entry):
                raise TokensError(
                    f"{source}: {principal}: {entry!r} is not sha256:<64 hex digits> (the file "
                    f"holds hashes, never tokens; `tidelog token create` writes them)"
                )
            if principals.setdefault(entry, principal) != principal:
                raise TokensError(f"{source}: one token hash is given to two principals")
    return TokenStore(principals, _parse_scram(document.get(SCRAM_SECTION, {}), principals, source))


def _parse_scram(section: Any, principals: Mapping[str, str], source: str) -> dict[str, ScramUser]:
    """The ``[scram-sha-256]`` tables; keys of tokens no longer in ``principals`` are left out
    (the token was revoked)."""
    where = f"{source}: [{SCRAM_SECTION}]"
    if not isinstance(section, dict):
        raise TokensError(f"{where} must hold a table per principal")
    users: dict[str, ScramUser] = {}
    for principal, entry in section.items():
        here = f"{where}.{principal}"
        if not _PRINCIPAL.match(principal):
            raise TokensError(f"{where}: {principal!r} is not a principal name")
        if not isinstance(entry, dict) or set(entry) != {"salt", "iterations", "keys"}:
            raise TokensError(f"{here} must have exactly salt, iterations and keys")
        salt, iterations, table = entry["salt"], entry["iterations"], entry["keys"]
        try:
            salt_bytes = unb64(salt, "salt") if isinstance(salt, str) else b""
        except ScramFailure as failure:
            raise TokensError(f"{here}: {failure}") from None
        if len(salt_bytes) < _MIN_SALT_BYTES:
            raise TokensError(f"{here}: salt must be base64 of {_MIN_SALT_BYTES}+ bytes")
        if type(iterations) is not int or iterations < ITERATIONS:
            raise TokensError(f"{here}: iterations must be an integer, {ITERATIONS} or more")
        if not isinstance(table, dict):
            raise TokensError(f"{here}.keys must be a table of token hash = {{stored_key, …}}")
        keys: dict[str, ScramKeys] = {}
        for entry_digest, value in table.items():
            if not _DIGEST.match(entry_digest):
                raise TokensError(f"{here}.keys: {entry_digest!r} is not a token hash")
            owner = principals.get(entry_digest)
            if owner is not None and owner != principal:
                raise TokensError(f"{here}.keys: {entry_digest} is a token of {owner}")
            parsed = _scram_keys(value, f"{here}.keys.{entry_digest}")
            if owner == principal:
                keys[entry_digest] = parsed
        if keys:
            users[principal] = ScramUser(salt_bytes, iterations, keys)
    return users


def _scram_keys(value: Any, where: str) -> ScramKeys:
    if not isinstance(value, dict) or set(value) != {"stored_key", "server_key"}:
        raise TokensError(f'{where} must be {{ stored_key = "…", server_key = "…" }}')
    try:
        stored, server = (
            unb64(value[k], k) if isinstance(value[k], str) else b""
            for k in ("stored_key", "server_key")
        )
    except ScramFailure as failure:
        raise TokensError(f"{where}: {failure}") from None
    if len(stored) != 32 or len(server) != 32:
        raise TokensError(f"{where}: stored_key and server_key are base64 of 32 bytes")
    return ScramKeys(stored, server)


def load_tokens(path: Path) -> TokenStore:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TokensError(
            f"{path}: cannot read the tokens file: {error.strerror or error}"
        ) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise TokensError(f"{path}: not a TOML file: {error}") from None
    return parse_tokens(document, str(path))


def add_token(path: Path, principal: str, *, scram: bool = False) -> str:
    """Create a token for ``principal``, add its hash (and with ``scram`` its SCRAM-SHA-256
    keys) to the tokens file at ``path`` (created 0600 when missing) and return the token; the
    only time it is seen."""
    if not _PRINCIPAL.match(principal):
        raise TokensError(f"{principal!r} is not a principal name (letters, digits, _.@:-)")
    store = load_tokens(path) if path.exists() else TokenStore({})
    token = new_token()
    principals = {**store.principals, digest(token): principal}
    users = dict(store.scram)
    if scram:
        user = users.get(principal) or ScramUser(secrets.token_bytes(SALT_BYTES), ITERATIONS, {})
        keys = {**user.keys, digest(token): derive(token, user.salt, user.iterations)}
        users[principal] = ScramUser(user.salt, user.iterations, keys)
    _write(path, TokenStore(principals, users))
    return token


def _write(path: Path, store: TokenStore) -> None:
    by_owner: dict[str, list[str]] = {}
    for entry, owner in store.principals.items():
        by_owner.setdefault(owner, []).append(entry)
    lines = ["# principal = token hashes (sha256); written by `tidelog token create`", "[tokens]"]
    for owner in sorted(by_owner):
        hashes = ", ".join(f'"{d}"' for d in by_owner[owner])
        lines.append(f'"{owner}" = [{hashes}]')
    if store.scram:
        lines += [
            "",
            "# SCRAM-SHA-256 keys of Kafka clients' tokens (`tidelog token create --scram`); a",
            "# key counts while its token's hash is in [tokens]",
        ]
    for owner in sorted(store.scram):
        user = store.scram[owner]
        lines += [
            f'[{SCRAM_SECTION}."{owner}"]',
            f'salt = "{b64(user.salt)}"',
            f"iterations = {user.iterations}",
            f'[{SCRAM_SECTION}."{owner}".keys]',
            *(
                f'"{d}" = {{ stored_key = "{b64(k.stored_key)}", '
                f'server_key = "{b64(k.server_key)}" }}'
                for d, k in user.keys.items()
            ),
        ]
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    # os.open's mode applies only to a file it creates: one left by an interrupted run keeps its
    # own (readable by everyone, say) unless it is set here, before anything is written.
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
