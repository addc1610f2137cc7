"""A small real filesystem for full-disk tests: a tmpfs the test mounts (root only), and a file
that fills it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``"4m"``) mounted at ``where`` for the block, always unmounted
    after. The test is skipped where none can be mounted (not root, or no mount here): the
    injected faults of ``tests/log/test_write_faults.py`` cover the same paths everywhere."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; test_write_faults.py injects the same failures")
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill_disk(directory: Path) -> Path:
    """Write a file until the filesystem refuses more; return it (delete it to free the space)."""
    filler = directory / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(chunk)
    return filler
