"""The materialised views of one stream: declaring, following the log, answering queries.

Every view has one :class:`~tidelog.broker.partition_view.PartitionView` per partition, stored under
``<stream directory>/views/<view>/<partition>/``. One asyncio task per partition view follows
the partition's commit signal and applies new records in a worker thread, so views stay close
behind the log without slowing publishes down. A query first catches the partition views up to
the high watermark (in a thread), so it sees every message acknowledged before it was asked.

Queries over several partitions merge the per-partition answers, each already in the asked
direction, with a merge that knows the direction (ascending or descending) — the mistake Kafka's
merged iterators made (responsive-pub#178) is to assume ascending order.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, TypeVar

from tidelog.broker.descriptors import VIEW_STORE_DESCRIPTORS, DescriptorBudget
from tidelog.broker.partition import Partition
from tidelog.broker.partition_view import PartitionView, ViewEntry, ViewKind, ViewSpec
from tidelog.errors import (
    InvalidArgument,
    LimitReached,
    OutOfDescriptors,
    ViewExists,
    ViewNotFound,
)

LOG = logging.getLogger("tidelog.broker.views")

DEFAULT_LIMIT: Final = 1000
MAX_LIMIT: Final = 100_000
T = TypeVar("T")


def view_query_limit(limit: int | None) -> int:
    if limit is None or limit == 0:
        return DEFAULT_LIMIT
    if not 0 < limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}, not {limit}")
    return limit


class StreamViews:
    """The views of one stream; everything but the worker-thread calls runs on the loop."""

    def __init__(
        self,
        stream: str,
        directory: Path,
        partitions: list[Partition],
        budget: DescriptorBudget | None = None,
    ) -> None:
        """``budget``: where the views' stores reserve their descriptors (None: unbounded)."""
        self.stream = stream
        self.directory = directory / "views"
        self.partitions = partitions
        self.specs: dict[str, ViewSpec] = {}
        self._budget = budget
        self._views: dict[str, list[PartitionView]] = {}
        self._left_closed: dict[str, str] = {}
        """Views declared but not opened at start (no room in the budget): name -> why."""
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}
        self._closed = False
        self._changing = asyncio.Lock()
        """One declare or drop at a time: each awaits a thread between its check and its
        change, and two at once could open two stores on one directory."""

    # -- lifecycle (blocking parts run in threads) -----------------------------------------------

    def open(self, specs: list[ViewSpec]) -> None:
        """Open the stored views (blocking; at broker start). Leftover directories of views no
        longer declared (a drop interrupted by a crash) are removed."""
        for spec in specs:
            self.specs[spec.name] = spec
            try:
                self._views[spec.name] = self._open_view(spec, declared=True)
            except (LimitReached, OutOfDescriptors) as error:
                self._left_closed[spec.name] = str(error)
                LOG.warning("view %s of stream %s left closed: %s", spec.name, self.stream, error)
        if self.directory.exists():
            for leftover in self.directory.iterdir():
                if leftover.name not in self.specs:
                    shutil.rmtree(leftover, ignore_errors=True)

    def _cost(self, spec: ViewSpec) -> int:
        return len(self.partitions) * VIEW_STORE_DESCRIPTORS[spec.kind]

    def _open_view(self, spec: ViewSpec, *, declared: bool = False) -> list[PartitionView]:
        """Reserve the view's descriptors, then open its stores (``LimitReached`` when they do
        not fit; nothing stays reserved or open when an open fails). ``declared``: a view
        declared before, opened at start (it may go past the views' half: ``descriptors.py``)."""
        cost = self._cost(spec)
        if self._budget is not None:
            what = f"view {spec.name!r} of stream {self.stream!r} ({len(self.partitions)} stores)"
            self._budget.reserve_views(cost, what, declared=declared)
        opened: list[PartitionView] = []
        try:
            for p in self.partitions:
                opened.append(
                    PartitionView(spec, p.number, self.directory / spec.name / str(p.number))
                )
        except BaseException:
            for view in opened:
                view.close()
            if self._budget is not None:
                self._budget.release_views(cost)
            raise
        return opened

    def _release(self, views: list[PartitionView]) -> None:
        if self._budget is not None and views:
            self._budget.release_views(self._cost(views[0].spec))

    def start(self) -> None:
        """Start following the log for every open view (on the loop)."""
        for name in self._views:
            self._follow_all(name)

    def _follow_all(self, name: str) -> None:
        self._tasks[name] = [
            asyncio.create_task(self._follow(p, v), name=f"view {self.stream}/{name}/{p.number}")
            for p, v in zip(self.partitions, self._views[name], strict=True)
        ]

    async def _follow(self, partition: Partition, view: PartitionView) -> None:
        while not (partition.deleted or partition.closed):
            waiter = partition.signal.current()
            log = partition.current_log
            if log is not None and view.applied <= log.high_watermark:
                try:
                    await asyncio.to_thread(view.catch_up, log)
                except Exception:  # a broken view must not take the broker down
                    LOG.exception(
                        "view %s/%s/%d failed", self.stream, view.spec.name, view.partition
                    )
                    await asyncio.sleep(1.0)
                continue
            # Not ``await waiter``: cancelling this task (``_stop``) would cancel the future
            # every waiter on the partition shares.
            await asyncio.wait([waiter])

    async def _stop(self, name: str) -> None:
        tasks = self._tasks.pop(name, [])
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self) -> None:
        """Stop following and close every view (flushed and checkpointed)."""
        self._closed = True
        for name in list(self._tasks):
            await self._stop(name)
        views = [v for vs in self._views.values() for v in vs]

        def close_all() -> None:
            for view in views:
                view.close()

        await asyncio.to_thread(close_all)
        for opened in self._views.values():
            self._release(opened)
        self._views.clear()

    async def checkpoint(self) -> None:
        """Flush and checkpoint every view that moved (maintenance)."""
        views = [v for vs in self._views.values() for v in vs]

        def checkpoint_all() -> None:
            for view in views:
                view.checkpoint()

        await asyncio.to_thread(checkpoint_all)

    # -- declare, drop, list ---------------------------------------------------------------------

    async def declare(self, spec: ViewSpec) -> bool:
        """Add ``spec``; False when an identical view already exists (declaring is idempotent).
        The caller persists the stream's metadata when this returns True."""
        spec.validate()
        async with self._changing:
            return await self._declare(spec)

    async def _declare(self, spec: ViewSpec) -> bool:
        known = self.specs.get(spec.name)
        if known is not None:
            if known == spec:
                return False
            raise ViewExists(self.stream, spec.name)

        def open_clean() -> list[PartitionView]:
            # A directory left by an earlier view of this name would carry its data.
            shutil.rmtree(self.directory / spec.name, ignore_errors=True)
            return self._open_view(spec)

        self._views[spec.name] = await asyncio.to_thread(open_clean)
        self.specs[spec.name] = spec
        self._follow_all(spec.name)
        LOG.info("declared %s view %s on stream %s", spec.kind.value, spec.name, self.stream)
        return True

    async def drop(self, name: str) -> None:
        """Remove the view and its files; the caller persists the stream's metadata."""
        async with self._changing:
            await self._drop(name)

    async def _drop(self, name: str) -> None:
        if name not in self.specs:
            raise ViewNotFound(self.stream, name)
        await self._stop(name)
        views = self._views.pop(name, [])
        self._left_closed.pop(name, None)
        del self.specs[name]

        def remove() -> None:
            for view in views:
                view.close()
            shutil.rmtree(self.directory / name, ignore_errors=True)

        await asyncio.to_thread(remove)
        self._release(views)
        LOG.info("dropped view %s of stream %s", name, self.stream)

    async def status(self) -> list[tuple[ViewSpec, list[int], list[int]]]:
        """(spec, next offset to apply per partition, approximate entries per partition) per
        view; read in a worker thread under each view's lock (a catch-up may hold it for a
        while)."""
        # Taken here on the loop, in one go: a drop running meanwhile removes the name from
        # both dicts, so the thread below must not look anything up by name.
        views = [
            (self.specs[name], partition_views)
            for name, partition_views in sorted(self._views.items())
            if name in self.specs
        ]

        def read() -> list[tuple[ViewSpec, list[int], list[int]]]:
            return [
                (
                    spec,
                    [v.applied for v in partition_views],
                    [v.approximate_entries() for v in partition_views],
                )
                for spec, partition_views in views
            ]

        return await asyncio.to_thread(read)

    # -- queries ---------------------------------------------------------------------------------

    def _view(self, name: str, kind: ViewKind) -> list[PartitionView]:
        spec = self.specs.get(name)
        if spec is None:
            raise ViewNotFound(self.stream, name)
        if name in self._left_closed:
            raise LimitReached(
                "open_files_max",
                f"view {name!r} of stream {self.stream!r} was left closed at start: "
                f"{self._left_closed[name]}",
            )
        if spec.kind is not kind:
            other = "WindowFetch" if spec.kind is ViewKind.WINDOW else "ViewGet or ViewRange"
            raise InvalidArgument(
                f"view {name!r} of stream {self.stream!r} is a {spec.kind.value} view; "
                f"query it with {other}"
            )
        return self._views[name]

    async def _fresh(
        self, views: list[PartitionView], query: Callable[[PartitionView], T]
    ) -> list[T]:
        """Catch each partition view up to its log's high watermark, then run ``query`` on it
        under its lock, all in one worker thread."""
        pairs = [(self.partitions[v.partition], v) for v in views]

        def run() -> list[T]:
            answers = []
            for partition, view in pairs:
                log = partition.current_log
                if log is not None:
                    view.catch_up(log)
                with view.lock:
                    answers.append(query(view))
            return answers

        return await asyncio.to_thread(run)

    def _select(self, views: list[PartitionView], partition: int | None) -> list[PartitionView]:
        if partition is None:
            return views
        if not 0 <= partition < len(views):
            raise InvalidArgument(
                f"stream {self.stream!r} has partitions 0..{len(views) - 1}, not {partition}"
            )
        return [views[partition]]

    async def get(self, name: str, key: bytes, partition: int | None = None) -> ViewEntry | None:
        """The latest value of ``key`` (newest timestamp when several partitions hold it)."""
        views = self._select(self._view(name, ViewKind.TABLE), partition)
        return newest_view_entry(await self._fresh(views, lambda v: v.get(key)))

    async def range(
        self,
        name: str,
        from_key: bytes | None,
        to_key: bytes | None,
        *,
        reverse: bool = False,
        limit: int | None = None,
        partition: int | None = None,
    ) -> list[ViewEntry]:
        """Entries with ``from_key <= key <= to_key`` (None: open), ascending by key or
        descending (``reverse``), at most ``limit``; keys held by several partitions come once
        per partition, ordered by partition in the same direction."""
        if from_key is not None and to_key is not None and from_key > to_key:
            raise InvalidArgument(
                "from_key is after to_key; give the range in ascending order and set reverse "
                "for descending results"
            )
        count = view_query_limit(limit)
        views = self._select(self._view(name, ViewKind.TABLE), partition)
        answers = await self._fresh(views, lambda v: v.range(from_key, to_key, reverse, count))
        return merge_view_ranges(answers, reverse, count)

    async def window_fetch(
        self,
        name: str,
        key: bytes,
        time_from_ms: int | None,
        time_to_ms: int | None,
        *,
        backward: bool = False,
        limit: int | None = None,
        partition: int | None = None,
    ) -> list[ViewEntry]:
        """Values of ``key`` with timestamps (ms) in [time_from_ms, time_to_ms] (None: open),
        oldest first or newest first (``backward``), at most ``limit``."""
        if time_from_ms is not None and time_to_ms is not None and time_from_ms > time_to_ms:
            raise InvalidArgument(
                f"time_from_ms {time_from_ms} is after time_to_ms {time_to_ms}; give the range "
                f"in ascending order and set backward for newest-first results"
            )
        count = view_query_limit(limit)
        views = self._select(self._view(name, ViewKind.WINDOW), partition)
        answers = await self._fresh(
            views, lambda v: v.window_fetch(key, time_from_ms, time_to_ms, backward, count)
        )
        return merge_view_windows(answers, backward, count)


# -- merging per-partition answers (here, and across the brokers of a cluster) ------------------


def newest_view_entry(found: Iterable[ViewEntry | None]) -> ViewEntry | None:
    """A key's answer from several partitions: the newest value (ties: the higher partition)."""
    return max(
        (e for e in found if e is not None),
        key=lambda e: (e.timestamp_ns, e.partition),
        default=None,
    )


def merge_view_ranges(
    answers: Iterable[list[ViewEntry]], reverse: bool, limit: int
) -> list[ViewEntry]:
    """Per-partition key ranges, each already in the asked direction, as one: by key, then
    partition, at most ``limit``."""
    merged = heapq.merge(*answers, key=lambda e: (e.key, e.partition), reverse=reverse)
    return list(itertools.islice(merged, limit))


def merge_view_windows(
    answers: Iterable[list[ViewEntry]], backward: bool, limit: int
) -> list[ViewEntry]:
    """Per-partition window values, each already in the asked direction, as one: by time, then
    partition and offset, at most ``limit``."""
    merged = heapq.merge(
        *answers, key=lambda e: (e.timestamp_ns, e.partition, e.offset), reverse=backward
    )
    return list(itertools.islice(merged, limit))
