"""``tidelog --version`` and ``tidelog serve`` settings: a TOML file, TIDELOG_* variables and
flags, in that order of precedence (flags > env > file)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.cli.clitools import CLI_TIMEOUT, Serve, clean_env, free_port, one_error_line, words

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
    assert message == "error: configuration file not found: missing.toml", message
    assert not (tmp_path / "tidelog-data").exists()


def test_serve_with_an_invalid_config_file_exits_2(tmp_path: Path) -> None:
    unknown_key = _config(tmp_path / "unknown.toml", port=0, metrics_port=0, colour="blue")
    bad_value = _config(tmp_path / "bad.toml", port=0, metrics_port=0, flush_policy="sometimes")
    not_toml = tmp_path / "broken.toml"
    not_toml.write_text("port = = 3\n")
    for config, expected in (
        (unknown_key, "error: colour: not a setting"),
        (bad_value, "error: flush_policy: input should be 'always', 'interval' or 'never'"),
        (not_toml, "error: broken.toml: not a TOML file: "),
    ):
        serve = Serve("--config", config.name, cwd=tmp_path)
        assert serve.wait() == 2, config.name
        stderr = serve.stderr()
        assert len(stderr.strip().splitlines()) == 1, stderr
        assert stderr.startswith(expected), (config.name, stderr)


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
    # Named as the variable: the file's bogus value is the one it replaced.
    assert words(serve.stderr()).startswith("error: TIDELOG_FLUSH_POLICY: input should be")


def _serve_refused(tmp_path: Path, *args: str, **env: str) -> str:
    """The one ``error:`` line of a ``tidelog serve`` that must stop before it starts."""
    done = subprocess.run(
        [sys.executable, "-m", "tidelog.cli", "serve", *args],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        cwd=tmp_path,
        timeout=CLI_TIMEOUT,
    )
    assert done.returncode == 2, (args, env, done.returncode, done.stderr)
    assert done.stdout == "", (args, env)
    assert "Traceback" not in done.stderr, (args, env)
    return one_error_line(done)


def test_an_invalid_setting_is_one_line_naming_it_as_given(tmp_path: Path) -> None:
    """A flag's setting by its name, a variable's by the variable: what is wrong (the value
    given) and what is expected, on one line, exit code 2 (not pydantic's report, nor click's
    box), and nothing written."""
    cases: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], tuple[str, ...]] = {
        (("--port", "abc"), ()): ("error: port: ", "'abc'", "integer"),
        (("--port", "70000"), ()): ("error: port: ", "70000", "65535"),
        (("--metrics-port", "-1"), ()): ("error: metrics_port: ", "-1", "or equal to 0"),
        (("--flush-policy", "sometimes"), ()): ("error: flush_policy: ", "'sometimes'", "'never'"),
        ((), (("TIDELOG_SEGMENT_MAX_BYTES", "abc"),)): (
            "error: TIDELOG_SEGMENT_MAX_BYTES: ", "'abc'", "integer",
        ),
        ((), (("TIDELOG_SITES", '{"b": "127.0.0.1:9"}'),)): (
            "error: sites are declared but site_id is not set",
        ),
        # Both wrong: both named, still one line.
        (("--port", "abc"), (("TIDELOG_SEGMENT_MAX_BYTES", "0"),)): (
            "error: port: ", "; TIDELOG_SEGMENT_MAX_BYTES: ", "greater than or equal to 1",
        ),
    }  # fmt: skip
    with ThreadPoolExecutor(max_workers=2) as pool:
        lines = list(pool.map(lambda c: _serve_refused(tmp_path, *c[0], **dict(c[1])), cases))
    for case, line in zip(cases, lines, strict=True):
        first, *parts = cases[case]
        assert line.startswith(first), (case, line)
        for part in parts:
            assert part in line, (case, part, line)
    assert not (tmp_path / "tidelog-data").exists()


def test_a_flag_beats_an_invalid_variable(tmp_path: Path) -> None:
    """The variable a flag replaces is not read, so its bad value is no error."""
    port = free_port()
    env = clean_env(TIDELOG_PORT="abc", TIDELOG_METRICS_PORT="0")
    serve = Serve("--port", str(port), "--data-dir", str(tmp_path / "data"), env=env)
    try:
        assert serve.port() == port
    finally:
        assert serve.stop() == 0
