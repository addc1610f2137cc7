"""Where a site keeps its small documents: the registry of remote sites and what its sink
persisted about snapshots.

On a single broker they are JSON files in the data directory (``SiteFiles``: ``sites.json``,
``sites_sink.json``), replaced atomically. On a cluster they must move with the site from one
broker to the next, so they are records of the internal stream ``__lrq_state`` (``StateStream``),
replicated like the site's queues and led by the same broker: one record per change, keyed by the
document's name, its value the whole document as JSON. The stream is compacted, so it keeps
about one record per document; opening reads it whole (a few records) and keeps the newest of
each. A save is acknowledged once every in-sync replica holds it, so the broker that leads the
site next reads what this one saved.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Protocol

from tidelog.broker import NewRecord, Partition, StreamConfig
from tidelog.durable import replace_json
from tidelog.errors import SiteMoving

STATE_STREAM: Final = "__lrq_state"
STATE_CONFIG: Final = StreamConfig(partitions=1, compact=True)
REGISTRY: Final = "registry"
SINK: Final = "sink"
TRIMS: Final = "tag_trims"
"""A cluster's tag index marks: what it knows of the records no longer held (``send_queue``)."""
_FILES: Final = {REGISTRY: "sites.json", SINK: "sites_sink.json"}


class SiteState(Protocol):
    def load(self, name: str) -> Any | None:
        """The newest saved document ``name`` (None: never saved)."""
        ...

    async def save(self, name: str, document: Any) -> None:
        """Keep ``document`` as ``name``; raises when it cannot be kept (nothing changes)."""
        ...


class SiteFiles:
    """A single broker's documents: files in its data directory."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def path(self, name: str) -> Path:
        return self.data_dir / _FILES[name]

    def load(self, name: str) -> Any | None:
        try:
            return json.loads(self.path(name).read_bytes())
        except FileNotFoundError:
            return None

    async def save(self, name: str, document: Any) -> None:
        replace_json(self.path(name), document, indent=1)


class Unopened:
    """The documents of a site whose state is not read yet (a cluster's, before its open)."""

    def load(self, name: str) -> Any | None:
        return None

    async def save(self, name: str, document: Any) -> None:
        raise AssertionError(f"{name} saved before the site's state was opened")


class StateStream:
    """A cluster's documents: the newest record of each name in ``__lrq_state``."""

    def __init__(
        self, partition: Partition, owned: Callable[[], bool] | None = None, site_id: str = ""
    ) -> None:
        """``owned``: whether site ``site_id`` still runs here under the leadership it was
        opened with (a save is refused once not: ``SiteMoving``)."""
        self.partition = partition
        self.owned = owned
        self.site_id = site_id
        self._documents: dict[str, Any] = {}
        log = partition.log
        if log.high_watermark >= 0:
            for batch in log.forward_reader(log.oldest_offset):
                for key, value in zip(batch.keys(), batch.values(), strict=True):
                    if key is not None:
                        self._documents[bytes(key).decode()] = json.loads(value)

    def load(self, name: str) -> Any | None:
        return self._documents.get(name)

    async def save(self, name: str, document: Any) -> None:
        if self.owned is not None and not self.owned():
            raise SiteMoving(self.site_id)
        body = json.dumps(document, sort_keys=True).encode()
        await self.partition.publish([NewRecord(body, key=name.encode())], durable=True)
        self._documents[name] = document
