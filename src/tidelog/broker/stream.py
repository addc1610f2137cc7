"""A stream: a name, its settings and its partitions, persisted as ``stream.json`` beside them.

Layout: ``<data_dir>/streams/<name>/stream.json``, ``<data_dir>/streams/<name>/<n>/`` (the
commit log of partition ``n``) and ``<data_dir>/streams/<name>/views/`` (materialised views).
The metadata file is replaced atomically on every change, so a crash leaves either the old or
the new version.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from tidelog.broker.config import StreamConfig
from tidelog.broker.descriptors import DescriptorBudget
from tidelog.broker.partition import Partition
from tidelog.broker.partition_view import ViewSpec
from tidelog.broker.stream_views import StreamViews
from tidelog.durable import make_dirs, replace_json
from tidelog.errors import PartitionNotFound
from tidelog.log import LogConfig
from tidelog.log.filecache import DEFAULT_FILE_CACHE, FileCache

METADATA_FILE = "stream.json"


class Stream:
    def __init__(
        self,
        name: str,
        config: StreamConfig,
        directory: Path,
        defaults: LogConfig,
        loop: asyncio.AbstractEventLoop,
        *,
        created_ns: int | None = None,
        flags: dict[str, dict[str, bool]] | None = None,
        files: FileCache = DEFAULT_FILE_CACHE,
        held: bool = False,
        budget: DescriptorBudget | None = None,
    ) -> None:
        """``held``: a stream of a broker of a cluster (``Partition``'s ``held``). ``budget``:
        where its views reserve descriptors (the broker's; None: unbounded)."""
        self.name = name
        self.config = config
        self.directory = directory
        self.created_ns = created_ns or time.time_ns()
        flags = flags or {}
        log_config = config.log_config(defaults)
        self.partitions: list[Partition] = []
        try:
            for n in range(config.partitions):
                self.partitions.append(
                    Partition(
                        name,
                        n,
                        directory / str(n),
                        log_config,
                        loop,
                        paused=flags.get(str(n), {}).get("paused", False),
                        readonly=flags.get(str(n), {}).get("readonly", False),
                        files=files,
                        held=held,
                    )
                )
        except BaseException:
            # Opening partition n failed (a full disk, the descriptor limit): the logs opened
            # before it must not stay open behind a stream that does not exist.
            self.discard()
            raise
        self.resume_all = False
        """Set by a pause with ``resumeAll``: waking one partition wakes them all."""
        self.views = StreamViews(name, directory, self.partitions, budget)

    @property
    def subject(self) -> str:
        return self.config.subject or self.name

    def partition(self, number: int) -> Partition:
        if not 0 <= number < len(self.partitions):
            raise PartitionNotFound(self.name, number, len(self.partitions))
        return self.partitions[number]

    def select(self, numbers: list[int] | None) -> list[Partition]:
        """The partitions named (all when ``numbers`` is empty or None)."""
        if not numbers:
            return list(self.partitions)
        return [self.partition(n) for n in numbers]

    def reconfigure(self, config: StreamConfig, defaults: LogConfig) -> None:
        """Replace the settings (same partition count): each partition's limits and retention
        follow from the next operation on; saved."""
        if config.partitions != self.config.partitions:
            raise ValueError(f"stream {self.name!r}: the partition count cannot change")
        self.config = config
        for partition in self.partitions:
            partition.reconfigure(config.log_config(defaults))
        self.save()

    # -- persistence -----------------------------------------------------------------------------

    def save(self) -> None:
        data: dict[str, Any] = {
            "format": 1,
            "name": self.name,
            "created_ns": self.created_ns,
            "config": self.config.to_json(),
            "resume_all": self.resume_all,
            "views": [spec.to_json() for spec in self.views.specs.values()],
            "partitions": {
                str(p.number): {"paused": p.paused, "readonly": p.readonly} for p in self.partitions
            },
        }
        make_dirs(self.directory)
        replace_json(self.directory / METADATA_FILE, data, indent=2, sort_keys=True)

    @classmethod
    def load(
        cls,
        directory: Path,
        defaults: LogConfig,
        loop: asyncio.AbstractEventLoop,
        files: FileCache = DEFAULT_FILE_CACHE,
        held: bool = False,
        budget: DescriptorBudget | None = None,
    ) -> Stream:
        data = json.loads((directory / METADATA_FILE).read_text())
        stream = cls(
            data["name"],
            StreamConfig.from_json(data["config"]),
            directory,
            defaults,
            loop,
            created_ns=data.get("created_ns"),
            flags=data.get("partitions"),
            files=files,
            held=held,
            budget=budget,
        )
        stream.resume_all = bool(data.get("resume_all", False))
        stream.views.open([ViewSpec.from_json(v) for v in data.get("views", [])])
        return stream

    def close(self) -> None:
        for partition in self.partitions:
            partition.close()

    def discard(self) -> None:
        """Close every partition's log without writing anything (the stream is being deleted:
        its directory was renamed away, or is about to be removed)."""
        for partition in self.partitions:
            partition.delete()
