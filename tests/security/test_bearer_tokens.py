"""Bearer tokens: the file holds only their hashes, ``add_token`` writes it 0600 and hands the
token out once, an unknown token names nobody."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path

import pytest

from tidelog.security.tokens import (
    TokensError,
    add_token,
    digest,
    load_tokens,
    new_token,
    parse_tokens,
)


def test_parse_maps_each_hash_to_its_principal() -> None:
    a, b, c = new_token(), new_token(), new_token()
    store = parse_tokens({"tokens": {"alice": digest(a), "spark-job": [digest(b), digest(c)]}})
    assert store.principal_of(a) == "alice"
    assert store.principal_of(b) == store.principal_of(c) == "spark-job"
    assert store.principal_of(new_token()) is None
    assert store.principal_of("") is None


def test_a_token_is_long_random_and_recognisable() -> None:
    tokens = {new_token() for _ in range(20)}
    assert len(tokens) == 20
    assert all(t.startswith("tdl_") and len(t) >= 40 for t in tokens)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"token": {}}, "unknown key(s) token"),
        ({"tokens": {"alice": "hunter2"}}, "alice: 'hunter2' is not sha256:<64 hex digits>"),
        ({"tokens": {"alice": ["sha256:" + "0" * 63]}}, "is not sha256:<64 hex digits>"),
        ({"tokens": {"bad name!": digest("x")}}, "'bad name!' is not a principal name"),
        ({"tokens": {"a": digest("x"), "b": digest("x")}}, "one token hash is given to two"),
        ({"tokens": "alice"}, "[tokens] must be a table"),
    ],
)
def test_a_bad_file_is_refused_naming_the_entry(document: dict[str, object], message: str) -> None:
    with pytest.raises(TokensError) as refused:
        parse_tokens(document, "tokens.toml")
    assert str(refused.value).startswith("tokens.toml: ")
    assert message in str(refused.value)


def test_add_token_writes_only_the_hash_readable_by_the_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    first = add_token(path, "alice")
    second = add_token(path, "alice")
    third = add_token(path, "bob")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text(encoding="utf-8")
    for token in (first, second, third):
        assert token not in text
        assert digest(token) in text
    store = load_tokens(path)
    assert [store.principal_of(t) for t in (first, second, third)] == ["alice", "alice", "bob"]
    assert sorted(tomllib.loads(text)["tokens"]) == ["alice", "bob"]
    assert list(tmp_path.iterdir()) == [path], "a temporary file was left behind"


def test_add_token_is_0600_even_over_a_leftover_temporary_file(tmp_path: Path) -> None:
    """An interrupted earlier run can leave ``tokens.toml.tmp`` readable by everyone: the new
    file must not inherit that mode."""
    path = tmp_path / "tokens.toml"
    leftover = tmp_path / "tokens.toml.tmp"
    leftover.write_text("partial", encoding="utf-8")
    os.chmod(leftover, 0o644)
    add_token(path, "alice")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_add_token_refuses_a_bad_principal_and_a_bad_file(tmp_path: Path) -> None:
    with pytest.raises(TokensError, match="is not a principal name"):
        add_token(tmp_path / "t.toml", "no spaces")
    broken = tmp_path / "broken.toml"
    broken.write_text("[tokens\n", encoding="utf-8")
    with pytest.raises(TokensError, match="not a TOML file"):
        add_token(broken, "alice")
    assert broken.read_text(encoding="utf-8") == "[tokens\n", "a bad file was overwritten"
