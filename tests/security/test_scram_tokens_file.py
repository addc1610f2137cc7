"""The tokens file with SCRAM-SHA-256 keys: ``add_token(..., scram=True)`` and ``tidelog token
create --scram`` write keys the server checks a SCRAM login against, one salt per principal;
files without them read as before; a key counts only while its token's hash is in [tokens];
hand edits that do not make sense are refused naming the entry."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from tests.security.scram_client import client_final
from typer.testing import CliRunner

from tidelog.cli.app import app
from tidelog.security.scram import ITERATIONS, ScramExchange, derive
from tidelog.security.tokens import TokensError, add_token, digest, load_tokens, parse_tokens

OLD_FILE = """\
# principal = token hashes (sha256); written by `tidelog token create`
[tokens]
"alice" = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
"""


def test_a_file_without_scram_keys_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(OLD_FILE, encoding="utf-8")
    store = load_tokens(path)
    assert store.principal_of("test") == "alice"  # sha256("test")
    assert store.scram == {}
    # adding a token keeps what was there
    token = add_token(path, "bob")
    again = load_tokens(path)
    assert again.principal_of("test") == "alice" and again.principal_of(token) == "bob"


def test_scram_keys_are_derived_from_the_token_and_share_the_principals_salt(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.toml"
    first = add_token(path, "alice", scram=True)
    second = add_token(path, "alice", scram=True)
    plain = add_token(path, "alice")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    store = load_tokens(path)
    user = store.scram["alice"]
    assert user.iterations == ITERATIONS and len(user.salt) == 16
    assert set(user.keys) == {digest(first), digest(second)}  # the plain token has none
    assert user.keys[digest(first)] == derive(first, user.salt, ITERATIONS)
    assert store.principal_of(plain) == "alice"
    assert first not in path.read_text(encoding="utf-8")


def test_the_keys_written_log_a_scram_client_in(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    token = add_token(path, "alice", scram=True)
    server = ScramExchange(load_tokens(path).scram)
    first = server.first(b"n,,n=alice,r=nonce")
    assert server.final(client_final(token, first, "n=alice,r=nonce")).startswith(b"v=")
    assert server.digest == digest(token)


def test_a_revoked_tokens_keys_no_longer_count_and_are_dropped_on_rewrite(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    revoked = add_token(path, "alice", scram=True)
    kept = add_token(path, "alice", scram=True)
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace(f'"{digest(revoked)}", ', ""), encoding="utf-8")
    assert set(load_tokens(path).scram["alice"].keys) == {digest(kept)}
    add_token(path, "bob")
    assert digest(revoked) not in path.read_text(encoding="utf-8")


def test_the_cli_writes_scram_keys_with_scram(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    result = CliRunner().invoke(app, ["token", "create", "carol", "--file", str(path), "--scram"])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[0]
    store = load_tokens(path)
    assert store.principal_of(token) == "carol"
    assert digest(token) in store.scram["carol"].keys


def document(**scram: object) -> dict[str, object]:
    return {"tokens": {"alice": ["sha256:" + "a" * 64], "bob": ["sha256:" + "b" * 64]}, **scram}


KEY = {"stored_key": "A" * 43 + "=", "server_key": "B" * 43 + "="}
ENTRY = {"salt": "W22ZaJ0SNY7soEsUEjb6gQ==", "iterations": 4096}


@pytest.mark.parametrize(
    ("section", "reason"),
    [
        ({"alice": {**ENTRY}}, "exactly salt, iterations and keys"),
        ({"alice": {**ENTRY, "keys": {}, "extra": 1}}, "exactly salt, iterations and keys"),
        ({"alice": {**ENTRY, "salt": "%%", "keys": {}}}, "salt is not base64"),
        ({"alice": {**ENTRY, "salt": "AAAA", "keys": {}}}, "salt must be base64 of 8"),
        ({"alice": {**ENTRY, "iterations": 1000, "keys": {}}}, "iterations must be"),
        ({"alice": {**ENTRY, "iterations": True, "keys": {}}}, "iterations must be"),
        ({"alice": {**ENTRY, "keys": {"md5:x": KEY}}}, "is not a token hash"),
        ({"alice": {**ENTRY, "keys": {"sha256:" + "b" * 64: KEY}}}, "is a token of bob"),
        ({"alice": {**ENTRY, "keys": {"sha256:" + "a" * 64: {"stored_key": "A"}}}}, "must be"),
        (
            {"alice": {**ENTRY, "keys": {"sha256:" + "a" * 64: {**KEY, "server_key": "AAAA"}}}},
            "base64 of 32 bytes",
        ),
        ({"no one!": {**ENTRY, "keys": {}}}, "is not a principal name"),
        ("x", "must hold a table per principal"),
    ],
)
def test_a_scram_section_that_does_not_make_sense_is_refused(section: object, reason: str) -> None:
    with pytest.raises(TokensError, match=reason):
        parse_tokens(document(**{"scram-sha-256": section}))


def test_a_well_formed_section_is_read() -> None:
    store = parse_tokens(
        document(**{"scram-sha-256": {"alice": {**ENTRY, "keys": {"sha256:" + "a" * 64: KEY}}}})
    )
    assert list(store.scram["alice"].keys) == ["sha256:" + "a" * 64]
