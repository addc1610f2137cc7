"""``TidelogDataSource``: tidelog streams as a Spark data source (format ``"tidelog"``).

Theory of operation. Spark runs a Python data source in several processes: ``load()`` creates
the :class:`TidelogDataSource` (options are parsed and checked there) and pickles it; a planner
process calls ``reader()`` (batch) or ``streamReader()`` and asks for ``partitions()``; executors
call ``read()`` on unpickled copies and see only the :class:`ReadRange` they are given. So a
range carries everything a read needs (servers, TLS and credentials, stream, partition, offsets,
direction) and every ``read()`` opens and closes its own broker connection.

Planning turns options (and, for batch reads, pushed filters) into per-partition offset ranges
``[start, stop)`` against the broker's committed offsets, then splits large ranges into several
Spark tasks, and (batch reads without ``minPartitions``) packs small ones together, so a task may
read the ranges of several partitions, one after another (``ReadRange.more``). ``read()``
fetches exactly its ranges with stop offsets, so a replayed task or micro-batch reads the same
records (unless retention removed some meanwhile: ``failOnDataLoss``).

Every Python process of the read (the data source's, the planner's, the executors' workers)
freezes its garbage collector's objects once (``tidelog.spark.worker_gc``): PySpark collects
garbage after every task, and that walk of the imported libraries cost more than a small read.

Columns: a read emits the columns of the schema Spark gives ``reader(schema)`` (the user's, or
the source's own, narrowed by option ``columns``), and only those are built
(``tidelog.spark.columns``): a query that needs two columns does not pay Spark for seven. A read
without the ``value`` column asks the broker not to send values at all (``without_values``).

Streaming offsets (Spark's checkpoint) are ``{"<stream>": {"<partition>": next offset}}``; a
micro-batch reads ``[previous end, end)`` of each partition. A partition that appears during the
query (absent from the previous end) is read from its oldest retained offset.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    Filter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from tidelog.client import Client, ClientTls
from tidelog.errors import InvalidOption, OffsetsLost
from tidelog.spark import remote, worker_gc
from tidelog.spark.coalesce import coalesce
from tidelog.spark.columns import columns_of, ddl
from tidelog.spark.options import EARLIEST, LATEST, ReadOptions, parse
from tidelog.spark.planning import (
    OffsetRange,
    PartitionBounds,
    admit,
    decode_offsets,
    encode_offsets,
    offset_of,
    pack,
    partitions_in,
    split,
)
from tidelog.spark.pushdown import PushedFilters, push
from tidelog.spark.sink import batch_writer, stream_writer
from tidelog.wire.arrow import COLUMNS

SPARK_SCHEMA_DDL: Final = ddl()
"""The source's schema; ``tidelog.wire.arrow.arrow_schema()`` is its Arrow form, field for
field."""


@dataclass(frozen=True)
class ReadRange(InputPartition):
    """One Spark task: offsets ``[start, stop)`` of one partition, and how to read them."""

    servers: tuple[str, ...]
    tls: ClientTls
    stream: str
    partition: int
    start: int
    stop: int
    reverse: bool = False
    fail_on_data_loss: bool = True
    from_oldest: bool = False
    """A partition new to a streaming query: whatever retention removed before it was ever
    seen is not a loss."""
    columns: tuple[str, ...] = COLUMNS
    """The columns the read emits, in order (``tidelog.spark.columns``)."""
    more: tuple[OffsetRange, ...] = ()
    """Further ranges (of this or other partitions) the task reads after the first, in this
    order (small ranges packed into one task: ``tidelog.spark.planning.pack``)."""

    def ranges(self) -> tuple[OffsetRange, ...]:
        """Every range of the task, in reading order."""
        return (OffsetRange(self.partition, self.start, self.stop), *self.more)


def read_range(task: InputPartition) -> Iterator[pa.RecordBatch]:
    """The records of one task, range after range over one connection, as Arrow batches of the
    task's columns, the broker's frames joined into batches of about
    ``tidelog.spark.coalesce.TARGET_ROWS`` rows (``InputPartition(None)``: Spark's stand-in
    for a plan without ranges, reads nothing)."""
    if not isinstance(task, ReadRange):
        return
    worker_gc.settle()
    frames = _frames(task)
    try:
        yield from coalesce(frames)
    finally:
        frames.close()  # ends the subscription and the connection when Spark stops early


def _frames(task: ReadRange) -> Generator[pa.RecordBatch, None, None]:
    """One Arrow batch per broker frame of the task's ranges, in reading order."""
    client = remote.connect(task.servers, task.tls)
    try:
        for piece in task.ranges():
            for batch in remote.read_range(
                client,
                task.stream,
                piece.partition,
                piece.start,
                piece.stop,
                reverse=task.reverse,
                fail_on_data_loss=task.fail_on_data_loss and not task.from_oldest,
                values="value" in task.columns,  # else the broker sends no value bytes
            ):
                yield batch.to_arrow(task.columns)
    finally:
        client.close()


class TidelogDataSource(DataSource):
    """Register with ``spark.dataSource.register(TidelogDataSource)``, then
    ``spark.read.format("tidelog").option("stream", ...).load()`` (or ``readStream``)."""

    def __init__(self, options: dict[str, str]) -> None:
        worker_gc.settle()  # in PySpark's create_data_source process (no-op in a driver)
        super().__init__(options)
        self.read_options = parse(options)

    @classmethod
    def name(cls) -> str:
        return "tidelog"

    def schema(self) -> str:
        """The schema (Kafka's, with ``stream`` for ``topic``), narrowed to option ``columns``
        when given. Spark asks for it in ``load()`` (unless the user gave a schema), so an
        unknown stream is reported there."""
        if self.read_options.stream:
            client = remote.connect(self.read_options.servers, self.read_options.tls)
            try:
                remote.stream_info(client, self.read_options.stream)
            finally:
                client.close()
        return ddl(self.read_options.columns or COLUMNS)

    def reader(self, schema: StructType) -> DataSourceReader:
        """``schema``: the user's, or the one :meth:`schema` gave; the read emits its columns."""
        worker_gc.settle()  # in PySpark's planner processes
        columns = columns_of(schema)
        if called_by_pyspark_pushdown_worker():
            return TidelogPushdownReader(self.read_options, columns=columns)
        return TidelogBatchReader(self.read_options, columns=columns)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        self.read_options.check_streaming()
        return TidelogStreamReader(self.read_options, columns=columns_of(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The exactly-once sink (``tidelog.spark.sink``); ``overwrite`` is refused."""
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """The exactly-once streaming sink (``tidelog.spark.sink``)."""
        return stream_writer(self.options, schema, overwrite)


PUSHDOWN_WORKER_FILE = "data_source_pushdown_filters.py"
"""The file of PySpark's filter-pushdown worker (``pyspark/sql/worker/``), the one caller of
``DataSource.reader`` that then calls ``pushFilters``."""


def called_by_pyspark_pushdown_worker() -> bool:
    """Whether PySpark's filter-pushdown worker is the caller of ``TidelogDataSource.reader``.

    Why: a reader whose class overrides ``pushFilters`` fails every read with
    DATA_SOURCE_PUSHDOWN_DISABLED unless ``spark.sql.python.filterPushdown.enabled`` is true, and
    a data source cannot see that setting (no PySpark API tells a ``DataSource`` which worker
    runs it or what the SQL conf holds). So the reader that implements ``pushFilters`` is handed
    out only to the worker that will call it, and every other caller gets the plain reader, which
    plans from the options alone.

    What it relies on, in PySpark 4.3.0 (the version ``pyproject.toml`` pins):

    - ``pyspark/sql/worker/data_source_pushdown_filters.py``, function ``_main``, calls
      ``data_source.reader(schema=schema)`` itself and then ``reader.pushFilters(...)``; so the
      frame that called ``reader()`` is one of that file (this walks up to 8 frames, for a
      wrapper PySpark might add; 1 suffices today).
    - ``pyspark/sql/worker/plan_data_source_read.py``, function ``_main``, never calls
      ``pushFilters`` and raises DATA_SOURCE_PUSHDOWN_DISABLED for a reader that overrides it
      while the setting is off.

    ``tests/spark/test_spark_pushdown_worker.py`` checks both against the installed PySpark and
    fails, naming the change, when an upgrade breaks either; the Spark tests that read with
    pushdown on and off check the outcome end to end.
    """
    frame = sys._getframe(1)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith(PUSHDOWN_WORKER_FILE):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


# -- batch ------------------------------------------------------------------------------------


class TidelogBatchReader(DataSourceReader):
    """A batch read: each selected partition's range from the options, split into tasks of at
    most ``maxOffsetsPerPartition`` offsets; without ``minPartitions``, consecutive small
    ranges are packed into tasks of up to that many offsets too."""

    def __init__(
        self,
        options: ReadOptions,
        bounds: PushedFilters | None = None,
        *,
        columns: tuple[str, ...] = COLUMNS,
    ) -> None:
        self.options = options
        self.bounds = bounds
        self.columns = columns

    def partitions(self) -> list[InputPartition]:
        options = self.options
        stream = options.require_stream()
        client = remote.connect(options.servers, options.tls)
        try:
            ranges = plan_batch(client, options, self.bounds)
        finally:
            client.close()
        tasks = group_tasks(ranges, options)
        return [
            ReadRange(
                options.servers,
                options.tls,
                stream,
                first.partition,
                first.start,
                first.stop,
                reverse=options.reverse,
                fail_on_data_loss=options.fail_on_data_loss,
                columns=self.columns,
                more=tuple(rest),
            )
            for first, *rest in tasks
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)


class TidelogPushdownReader(TidelogBatchReader):
    """The batch reader that also takes Spark's filters (see ``tidelog.spark.pushdown``)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.bounds = PushedFilters()
        return iter(list(push(self.options.require_stream(), filters, self.bounds)))


def group_tasks(ranges: list[OffsetRange], options: ReadOptions) -> list[tuple[OffsetRange, ...]]:
    """The ranges split into pieces of at most ``maxOffsetsPerPartition`` offsets, one task
    each with ``minPartitions``, else small pieces packed into tasks (``planning.pack``)."""
    pieces = split(
        ranges,
        options.max_offsets_per_partition,
        options.min_partitions,
        newest_first=options.reverse,
    )
    if options.min_partitions is not None:
        return [(r,) for r in pieces]  # as many tasks as asked for
    return pack(pieces, options.max_offsets_per_partition)


def plan_batch(
    client: Client, options: ReadOptions, bounds: PushedFilters | None
) -> list[OffsetRange]:
    """Each selected partition's ``[start, stop)`` from the options, narrowed by ``bounds``."""
    stream = options.require_stream()
    info = remote.stream_info(client, stream)
    wanted = partitions_in(stream, (p.partition for p in info.partitions), options.partitions)
    if bounds is not None:
        wanted = [p for p in wanted if bounds.allows_partition(p)]
    held = remote.bounds(client, stream, wanted, known=True)
    ranges = []
    for partition in wanted:
        have = held[partition]
        start, stop = _option_range(client, options, have)
        if bounds is not None:
            start, stop = _narrow(client, stream, have, bounds, start, stop)
        ranges.append(OffsetRange(partition, start, max(start, stop)))
    return ranges


def _option_range(client: Client, options: ReadOptions, have: PartitionBounds) -> tuple[int, int]:
    """``[start, stop)`` from the offset and timestamp options (timestamps win, as in Kafka's
    source). Offsets the options name explicitly must not end before they start."""
    stream, partition = options.require_stream(), have.partition
    starting, ending = options.starting_offsets, options.ending_offsets
    first = EARLIEST if starting is None else starting.for_partition(partition)
    last = LATEST if ending is None else ending.for_partition(partition)
    if options.starting_timestamp_ms is not None:
        start = remote.first_at_or_after(client, have, stream, options.starting_timestamp_ms)
    elif 0 <= first < have.oldest:
        start = _lost_head(options, have, first)
    else:
        start = offset_of(first, have)
    if options.ending_timestamp_ms is not None:
        stop = remote.end_before(client, have, stream, options.ending_timestamp_ms)
    else:
        stop = min(offset_of(last, have), have.next)
        if options.starting_timestamp_ms is None and stop < start:
            raise InvalidOption(
                f"endingOffsets ({_describe(last)}: {stop}) is before startingOffsets "
                f"({_describe(first)}: {start}) for partition {partition} of {stream!r}, whose "
                f"offsets are {have.oldest}..{have.next - 1}"
            )
    return start, stop


def _describe(position: int) -> str:
    return {EARLIEST: "earliest", LATEST: "latest"}.get(position, "offset")


def _lost_head(options: ReadOptions, have: PartitionBounds, first: int) -> int:
    message = (
        f"startingOffsets {first} for partition {have.partition} of {options.stream!r} was "
        f"removed by retention (the oldest retained offset is {have.oldest})"
    )
    if options.fail_on_data_loss:
        raise OffsetsLost(message + "; set option failOnDataLoss=false to start at the oldest")
    remote.LOG.warning("%s; starting at %d (failOnDataLoss=false)", message, have.oldest)
    return have.oldest


def _narrow(
    client: Client, stream: str, have: PartitionBounds, bounds: PushedFilters, start: int, stop: int
) -> tuple[int, int]:
    if bounds.empty:
        return start, start
    if bounds.offset_start is not None:
        start = max(start, bounds.offset_start)
    if bounds.offset_stop is not None:
        stop = min(stop, bounds.offset_stop)
    if start >= stop:
        return start, start
    if bounds.ts_min_ns is not None:
        before = remote.last_at_or_before(client, stream, have.partition, bounds.ts_min_ns - 1)
        if before is not None:
            start = max(start, before + 1)
    if bounds.ts_max_ns is not None:
        last = remote.last_at_or_before(client, stream, have.partition, bounds.ts_max_ns)
        stop = min(stop, have.oldest if last is None else last + 1)
    return start, stop


# -- streaming --------------------------------------------------------------------------------


class TidelogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of ``[previous end, end)`` per partition; admission control by
    ``maxOffsetsPerTrigger``; ``Trigger.AvailableNow`` reads up to what was there when the
    query started."""

    def __init__(self, options: ReadOptions, *, columns: tuple[str, ...] = COLUMNS) -> None:
        self.options = options
        self.columns = columns
        self.stream = options.require_stream()
        self._initial: dict[int, int] | None = None
        self._available_now: dict[int, int] | None = None

    def _next_offsets(self) -> dict[int, int]:
        """The next offset (high watermark + 1) of every selected partition."""
        client = remote.connect(self.options.servers, self.options.tls)
        try:
            info = remote.stream_info(client, self.stream)
        finally:
            client.close()
        have = {p.partition: p.high_watermark + 1 for p in info.partitions}
        return {p: have[p] for p in partitions_in(self.stream, have, self.options.partitions)}

    def initialOffset(self) -> dict[str, Any]:
        # Spark asks more than once; "latest" must mean the same moment every time.
        if self._initial is None:
            self._initial = self._resolve_start()
        return encode_offsets(self.stream, self._initial)

    def _resolve_start(self) -> dict[int, int]:
        options = self.options
        client = remote.connect(options.servers, options.tls)
        try:
            info = remote.stream_info(client, self.stream)
            wanted = partitions_in(
                self.stream, (p.partition for p in info.partitions), options.partitions
            )
            held = remote.bounds(client, self.stream, wanted)
            starts = {}
            for partition, have in held.items():
                if options.starting_timestamp_ms is not None:
                    starts[partition] = remote.first_at_or_after(
                        client, have, self.stream, options.starting_timestamp_ms
                    )
                    continue
                spec = options.starting_offsets
                first = LATEST if spec is None else spec.for_partition(partition)
                starts[partition] = offset_of(first, have)
                if first >= 0 and first < have.oldest:
                    starts[partition] = _lost_head(options, have, first)
            return starts
        finally:
            client.close()

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._next_offsets()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = decode_offsets(self.stream, start)
        latest = self._next_offsets()
        if self._available_now is not None:
            latest = {
                p: min(o, self._available_now[p])
                for p, o in latest.items()
                if p in self._available_now
            }
        # A partition never goes backwards within a query's offsets.
        end = {p: max(o, begin.get(p, 0)) for p, o in latest.items()}
        end.update({p: o for p, o in begin.items() if p not in end})
        if isinstance(limit, ReadMaxRows):
            end = admit(begin, end, limit.max_rows)
        return encode_offsets(self.stream, end)

    def reportLatestOffset(self) -> dict[str, Any]:
        return encode_offsets(self.stream, self._next_offsets())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = decode_offsets(self.stream, start)
        finish = decode_offsets(self.stream, end)
        ranges = [OffsetRange(p, begin.get(p, 0), stop) for p, stop in sorted(finish.items())]
        options = self.options
        return [
            ReadRange(
                options.servers,
                options.tls,
                self.stream,
                r.partition,
                r.start,
                r.stop,
                fail_on_data_loss=options.fail_on_data_loss,
                from_oldest=r.partition not in begin,
                columns=self.columns,
            )
            for r in split(ranges, options.max_offsets_per_partition, options.min_partitions)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: Spark's checkpoint is the only record of what this query read."""
