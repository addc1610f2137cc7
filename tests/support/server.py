"""The test suite's real server: :class:`tidelog.process.ServerProcess`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from tidelog.process import READY, ServerProcess


@contextlib.contextmanager
def served(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """A started ``tidelog serve`` on a free loopback port, killed (by PID) when the block ends."""
    process = ServerProcess(data_dir, *extra, env=env).start()
    try:
        yield process
    finally:
        process.kill()


__all__ = ["READY", "ServerProcess", "served"]
