"""Small JSON state files of the broker (stream metadata, snapshots, view checkpoints)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def replace_json(path: Path, data: Any, **dump: Any) -> None:
    """Replace ``path`` with ``data`` as JSON atomically: a temp file beside it, fsync, rename.

    A crash leaves either the old file or the new one, never a torn one. ``dump``: options for
    ``json.dump`` (e.g. ``indent``).
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, **dump)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk: the old file stays whole; the partial temp file must not hold the space.
        tmp.unlink(missing_ok=True)
        raise
