"""Shared fixtures: commit logs opened under ``tmp_path`` and always closed when the test ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidelog.log import FlushPolicy, LogConfig, SegmentedLog


class LogFactory:
    """Opens ``SegmentedLog`` objects in directories under one root and remembers them all.

    The default policy is ``NEVER`` so that no test starts the shared background flusher unless
    it asks for ``INTERVAL``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.opened: list[SegmentedLog] = []

    def __call__(
        self,
        name: str | Path = "log",
        config: LogConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
        **kwargs: Any,
    ) -> SegmentedLog:
        directory = name if isinstance(name, Path) else self.root / name
        if config is None:
            config = LogConfig(flush_policy=FlushPolicy.NEVER)
        if clock is not None:
            kwargs["clock"] = clock
        log = SegmentedLog(directory, config, **kwargs)
        self.opened.append(log)
        return log

    def close_all(self) -> None:
        for log in reversed(self.opened):
            log.close()  # idempotent; a close that fails here is a finding, not noise


@pytest.fixture
def make_log(tmp_path: Path) -> Iterator[LogFactory]:
    factory = LogFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.close_all()
