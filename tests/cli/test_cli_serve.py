"""``tidelog --version`` and ``tidelog serve`` settings: a TOML file, TIDELOG_* variables and
flags, in that order of precedence (flags > env > file)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cli.clitools import Serve, clean_env, free_port, words

from tidelog import __version__


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "--version"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, f"tidelog {__version__}", "")
    assert __version__


def _config(path: Path, **settings: object) -> Path:
    lines = [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_serve_with_a_missing_config_file_exits_2(tmp_path: Path) -> None:
    serve = Serve("--config", "missing.toml", cwd=tmp_path)
    assert serve.wait() == 2
    message = words(serve.stderr())
    assert message.startswith("error: invalid settings:"), message
    assert "configuration file not found: missing.toml" in message
    assert not (tmp_path / "tidelog-data").exists()


def test_serve_with_an_invalid_config_file_exits_2(tmp_path: Path) -> None:
    unknown_key = _config(tmp_path / "unknown.toml", port=0, metrics_port=0, colour="blue")
    bad_value = _config(tmp_path / "bad.toml", port=0, metrics_port=0, flush_policy="sometimes")
    not_toml = tmp_path / "broken.toml"
    not_toml.write_text("port = = 3\n")
    for config, expected in ((unknown_key, "colour"), (bad_value, "flush_policy"), (not_toml, "")):
        serve = Serve("--config", config.name, cwd=tmp_path)
        assert serve.wait() == 2, config.name
        message = words(serve.stderr())
        assert message.startswith("error: invalid settings:"), message
        assert expected in message, (config.name, message)
        assert "Traceback" not in message


def test_serve_reads_a_toml_file(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "from-file"
    config = _config(
        tmp_path / "tidelog.toml",
        port=port,
        data_dir=str(data),
        flush_policy="always",
        metrics_port=0,
        log_format="json",
    )
    serve = Serve("--config", str(config), cwd=tmp_path)
    try:
        assert serve.port() == port
        assert (data / "broker-id").is_file()
        assert (data / "streams" / "__cursors").is_dir()
    finally:
        assert serve.stop() == 0
    log = [json.loads(line) for line in serve.stderr().splitlines()]  # log_format = "json"
    assert any("listening on" in entry["message"] for entry in log)
    assert not (tmp_path / "tidelog-data").exists()


def test_environment_beats_the_file_and_flags_beat_both(tmp_path: Path) -> None:
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    # The file's flush_policy is invalid: the server only starts if a higher source replaces it.
    config = _config(
        tmp_path / "tidelog.toml",
        port=file_port,
        data_dir=str(tmp_path / "file-data"),
        flush_policy="bogus",
        metrics_port=0,
    )
    env = clean_env(
        TIDELOG_PORT=str(env_port),
        TIDELOG_DATA_DIR=str(tmp_path / "env-data"),
        TIDELOG_FLUSH_POLICY="never",
    )
    serve = Serve("--config", str(config), env=env, cwd=tmp_path)
    try:
        assert serve.port() == env_port
        assert (tmp_path / "env-data" / "broker-id").is_file()
    finally:
        assert serve.stop() == 0

    env["TIDELOG_FLUSH_POLICY"] = "bogus"
    serve = Serve(
        "--config", str(config), "--port", str(flag_port), "--data-dir", "flag-data",
        "--flush-policy", "interval", env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert serve.port() == flag_port
        assert (tmp_path / "flag-data" / "broker-id").is_file()
    finally:
        assert serve.stop() == 0
    assert not (tmp_path / "file-data").exists()

    # And the variable alone (no flag) is read: its bogus value stops the server.
    serve = Serve("--config", str(config), env=env, cwd=tmp_path)
    assert serve.wait() == 2
    assert "flush_policy" in words(serve.stderr())
