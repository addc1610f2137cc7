"""One source of defaults: ``ServerSettings`` with nothing set hands the broker and every log
exactly the defaults those layers declare, and ``tidelog serve --help`` shows the same values.

The lower layers' constants are the values; ``ServerSettings`` names them. These tests catch a
default written again as a literal that then drifts from the one the layer below uses.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest
import typer

from tidelog.api.settings import ENV_PREFIX, ServerSettings
from tidelog.broker import BrokerConfig
from tidelog.cli.app import app


@pytest.fixture(autouse=True)
def _nothing_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing set means no ``TIDELOG_*`` variable either (a run of the suite with, say,
    ``TIDELOG_GRPC_TRANSPORT=native`` would otherwise compare the help with that)."""
    for name in list(os.environ):
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def test_default_settings_give_the_broker_its_own_defaults() -> None:
    given = ServerSettings().broker_config()
    # data_dir goes through Path, which drops the "./" of "./tidelog-data": the same directory.
    assert Path(given.data_dir) == Path(BrokerConfig().data_dir)
    assert dataclasses.replace(given, data_dir=BrokerConfig().data_dir) == BrokerConfig()


def test_serve_help_shows_the_settings_defaults() -> None:
    serve = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    shown = {}
    for param in serve.params:
        found = re.search(r"\[([^\]]+)\]", param.help or "")
        if found:
            shown[param.name] = found.group(1)
    assert set(shown) >= {"data_dir", "host", "port", "metrics_port", "flush_policy", "log_level"}
    defaults = ServerSettings()
    for name, text in shown.items():
        default = getattr(defaults, name)
        if isinstance(default, Path):
            assert Path(text) == default, name
        else:
            assert text == str(getattr(default, "value", default)), name
