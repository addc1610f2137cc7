"""Logs the damage tests open outside the ``make_log`` factory are closed after every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from logtools import DAMAGED_OPENED


@pytest.fixture(autouse=True)
def _close_damaged_logs() -> Iterator[None]:
    yield
    while DAMAGED_OPENED:
        DAMAGED_OPENED.pop().close()
