"""Small state files of the broker and the layers above (stream metadata, snapshots, view
checkpoints), replaced atomically."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tidelog.log.files import replace_file


def replace_json(path: Path, data: Any, **dump: Any) -> None:
    """Replace ``path`` with ``data`` as JSON atomically: a temp file beside it, fsync, rename
    (the log layer's ``replace_file``). A crash leaves either the old file or the new one, never
    a torn one; a failure (a full disk: ``DiskFull``) leaves the old file and no temp file.
    ``dump``: options for ``json.dumps`` (e.g. ``indent``)."""
    replace_file(path, json.dumps(data, **dump).encode(), sync=True)


def replace_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically, as :func:`replace_json` does (for binary
    snapshots such as the sites' tag index)."""
    replace_file(path, data, sync=True)
