"""The latest cursor per key of one ``__cursors`` partition, materialised from its log.

A fetch is a dictionary lookup, for a known and an unknown cursor alike: its cost does not grow
with the number of cursor updates the partition holds. The index is restored when the broker
starts: from its snapshot (``cursor-index.json`` in the partition's directory, written atomically
on close and by maintenance), then by replaying only the records appended after the offset the
snapshot covers. A snapshot that claims records the log no longer has (its tail was cut by
recovery) is ignored and the index is rebuilt from the whole log.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from tidelog.durable import replace_json
from tidelog.log import CommitLog, MessageBatch

LOG = logging.getLogger("tidelog.broker.cursors")

SNAPSHOT_FILE: Final = "cursor-index.json"
VALUE: Final = struct.Struct(">q")


class CursorIndex:
    """key -> (offset of the record that stored it, cursor value)."""

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[int, int]] = {}
        self.covered = -1
        """Every record up to this offset is reflected in ``entries``."""
        self.saved_covered = -1
        self.replayed = 0
        """Records read from the log by the last restore (0 when the snapshot was current)."""

    def apply(self, offset: int, key: bytes, value: bytes) -> None:
        """Take one stored record into account (older records than the known one are ignored)."""
        if len(value) != VALUE.size:
            return
        known = self.entries.get(key)
        if known is None or known[0] < offset:
            self.entries[key] = (offset, int(VALUE.unpack(value)[0]))
        self.covered = max(self.covered, offset)

    def get(self, key: bytes) -> int | None:
        found = self.entries.get(key)
        return None if found is None else found[1]

    # -- persistence -----------------------------------------------------------------------------

    @classmethod
    def restore(cls, log: CommitLog, directory: Path) -> CursorIndex:
        """The index of ``log``: its snapshot in ``directory`` plus the records after it."""
        index = cls._load(directory, log.high_watermark)
        start = index.covered + 1
        index._replay(log.forward_reader(start))
        return index

    @classmethod
    def rebuild(cls, log: CommitLog) -> CursorIndex:
        """The index of every record ``log`` holds, above a commit limit too, without its
        snapshot: what a replica that becomes the leader of a cursor partition serves from (its
        snapshot may describe records a truncation has since replaced)."""
        index = cls()
        index._replay(log.forward_reader(0, past_limit=True))
        return index

    def _replay(self, batches: Iterable[MessageBatch]) -> None:
        """Take ``batches`` (read from the partition, in offset order) into account."""
        for batch in batches:
            for offset, key, value in zip(
                batch.offsets.tolist(), batch.keys(), batch.values(), strict=True
            ):
                if key is not None:
                    self.apply(offset, key, value)
            self.covered = max(self.covered, batch.last_offset)
            self.replayed += len(batch)

    @classmethod
    def _load(cls, directory: Path, high_watermark: int) -> CursorIndex:
        index = cls()
        path = directory / SNAPSHOT_FILE
        try:
            data = json.loads(path.read_text())
            covered = int(data["covered"])
            entries = {base64.b64decode(k): (int(o), int(v)) for k, o, v in data["entries"]}
        except FileNotFoundError:
            return index
        except (ValueError, KeyError, TypeError) as error:
            LOG.warning("%s: unreadable cursor snapshot (%s); rebuilding from the log", path, error)
            return index
        if covered > high_watermark:
            LOG.warning(
                "%s: snapshot covers offset %d but the log ends at %d; rebuilding from the log",
                path,
                covered,
                high_watermark,
            )
            return index
        index.entries = entries
        index.covered = index.saved_covered = covered
        return index

    def snapshot(self) -> dict[str, object] | None:
        """The snapshot to write, or None if nothing changed since the last one (build it on the
        thread that updates the index; write it anywhere with :func:`write_snapshot`)."""
        if self.covered == self.saved_covered:
            return None
        self.saved_covered = self.covered
        return {
            "format": 1,
            "covered": self.covered,
            "entries": [[base64.b64encode(k).decode(), o, v] for k, (o, v) in self.entries.items()],
        }


def write_snapshot(directory: Path, data: dict[str, object]) -> None:
    """Replace the partition's snapshot atomically (temp file, fsync, rename)."""
    replace_json(directory / SNAPSHOT_FILE, data)
