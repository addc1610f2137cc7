"""Bearer tokens: random secrets handed to clients, kept by the server only as their SHA-256.

The tokens file (TOML) maps each principal to the hashes of its tokens::

    [tokens]
    alice = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    spark-job = ["sha256:…", "sha256:…"]   # several tokens: rotate without a gap

A token is 32 random bytes (:func:`new_token`), so a fast hash is enough: nothing shorter than
the secret itself can be guessed, and a leaked file reveals no token. ``tidelog token create``
writes an entry and prints the token once.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

PREFIX: Final = "sha256:"
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

    def principal_of(self, token: str) -> str | None:
        """The principal a token stands for, or None for an unknown token."""
        return self.principals.get(digest(token))


def parse_tokens(document: Mapping[str, Any], source: str = "the tokens file") -> TokenStore:
    unknown = set(document) - {"tokens"}
    if unknown:
        raise TokensError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (expected [tokens])"
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
    return TokenStore(principals)


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


def add_token(path: Path, principal: str) -> str:
    """Create a token for ``principal``, add its hash to the tokens file at ``path`` (created
    0600 when missing) and return the token; the only time it is seen."""
    if not _PRINCIPAL.match(principal):
        raise TokensError(f"{principal!r} is not a principal name (letters, digits, _.@:-)")
    existing: dict[str, list[str]] = {}
    if path.exists():
        store = load_tokens(path)
        for entry, owner in store.principals.items():
            existing.setdefault(owner, []).append(entry)
    token = new_token()
    existing.setdefault(principal, []).append(digest(token))
    lines = ["# principal = token hashes (sha256); written by `tidelog token create`", "[tokens]"]
    for owner in sorted(existing):
        hashes = ", ".join(f'"{d}"' for d in existing[owner])
        lines.append(f'"{owner}" = [{hashes}]')
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
    return token
