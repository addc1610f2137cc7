"""The ``tidelog`` sink: batch and streaming writes into one stream, exactly once.

Theory of operation. ``writer()``/``streamWriter()`` run on the driver side: they refuse
overwrite, check the options and the input schema, look up the output stream (which must exist)
and its partition count, and (batch writes) make the job id. The writer is pickled to the
executors, where ``write()`` gets one task's rows as Arrow batches, cuts them into chunks per
output partition (``tidelog.spark.chunks``) and publishes each chunk as an idempotent, atomic
batch over gRPC. The broker drops a chunk it already holds, so a retried task, a speculative
copy, or a micro-batch replayed after the query restarts from its checkpoint appends nothing
twice and, because it resends every chunk, leaves no gap either.

Nothing here relies on Spark's commit protocol for correctness: ``commit``/``abort`` only log.
A batch's records become visible to readers as each chunk is appended, before Spark commits the
micro-batch (there is no read-committed isolation), and ``abort`` never removes anything.

A chunk whose publish fails because the broker is unreachable (UNAVAILABLE: restarting,
network) is retried with backoff on a fresh connection for ``writeRetryTimeoutSeconds``; that is
safe because a retry of a publish that went through is answered ``duplicate``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

import grpc
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tidelog.client import Client, ClientError, Unavailable
from tidelog.client.models import Acks
from tidelog.spark import remote
from tidelog.spark.chunks import Chunk, Outbox, batch_producer_id, stream_producer_id
from tidelog.spark.sink_options import (
    InputColumns,
    WriteOptions,
    check_schema,
    parse_write_options,
    refuse_overwrite,
)

LOG = logging.getLogger("tidelog.spark.sink")

RETRYABLE: Final = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
"""Failures of reaching the broker, not of the request: retrying the same chunk is safe
(CANCELLED: a broker shutting down cancels the calls it had not started)."""
FIRST_BACKOFF_S: Final = 0.1
MAX_BACKOFF_S: Final = 2.0


@dataclass
class TaskCommit(WriterCommitMessage):
    """What one task wrote: records appended and records found already stored (a replay),
    per output partition."""

    task: int
    appended: dict[int, int] = field(default_factory=dict)
    duplicate: dict[int, int] = field(default_factory=dict)
    chunks: int = 0


@dataclass(frozen=True)
class SinkPlan:
    """Everything a task needs, fixed on the driver when the query (or batch job) starts."""

    options: WriteOptions
    columns: InputColumns
    partition_count: int


def plan(
    options: Mapping[str, str], schema: StructType, overwrite: bool, streaming: bool = False
) -> SinkPlan:
    """Refuse overwrite, check options and schema, look up the output stream. A streaming
    query's writer, which Spark creates again for each commit, waits for an output broker that
    does not answer (one restarting) as long as its writes would (``writeRetryTimeoutSeconds``);
    a batch write fails at once."""
    refuse_overwrite(overwrite)
    parsed = parse_write_options(options)
    columns = check_schema(schema)
    client = remote.connect(
        parsed.servers, parsed.tls, parsed.retry_timeout_s if streaming else 0.0
    )
    try:
        info = remote.stream_info(client, parsed.stream)
    finally:
        client.close()
    return SinkPlan(parsed, columns, len(info.partitions))


class Producer:
    """Publishes one task's chunks under one producer id, retrying while the broker is
    unreachable. Opens its connection lazily; ``close()`` it."""

    def __init__(self, options: WriteOptions, producer_id: str) -> None:
        self.options = options
        self.producer_id = producer_id
        self._client: Client | None = None
        self.commit = TaskCommit(task=-1)

    def send(self, chunk: Chunk) -> None:
        acks = self._publish(chunk)
        tally = self.commit.duplicate if acks.duplicate else self.commit.appended
        tally[chunk.partition] = tally.get(chunk.partition, 0) + len(chunk.values)
        self.commit.chunks += 1

    def _publish(self, chunk: Chunk) -> Acks:
        messages = chunk.messages()
        deadline: float | None = None
        delay = FIRST_BACKOFF_S
        while True:
            try:
                if self._client is None:
                    self._client = remote.connect(self.options.servers, self.options.tls)
                return self._client.publish_batch(
                    self.options.stream,
                    messages,
                    partition=chunk.partition,
                    producer_id=self.producer_id,
                    producer_sequence=chunk.sequence,
                    timeout=self.options.request_timeout_s or None,
                )
            except ClientError as error:
                if error.code not in RETRYABLE:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.options.retry_timeout_s
                if now >= deadline:
                    raise Unavailable(
                        f"gave up publishing to {self.options.stream!r} after "
                        f"{self.options.retry_timeout_s:g} s of retries "
                        f"(option writeRetryTimeoutSeconds): {error}"
                    ) from error
                LOG.warning(
                    "publishing chunk %d of partition %d failed (%s); retrying in %.1f s",
                    chunk.sequence,
                    chunk.partition,
                    error,
                    delay,
                )
                self._drop_client()
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, MAX_BACKOFF_S)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # a connection to a dead broker may fail to close cleanly
                LOG.debug("closing a failed connection", exc_info=True)

    def close(self) -> None:
        self._drop_client()


def write_task(
    plan: SinkPlan, producer_id: str, task: int, batch_id: int, batches: Iterable[pa.RecordBatch]
) -> TaskCommit:
    """Publish one task's rows; chunks go out as they fill, so a task holds at most one open
    chunk per output partition in memory."""
    options = plan.options
    outbox = Outbox(
        plan.columns,
        plan.partition_count,
        task,
        batch_id,
        max_chunk_bytes=options.max_chunk_bytes,
        max_chunk_records=options.max_chunk_records,
    )
    producer = Producer(options, producer_id)
    producer.commit.task = task
    try:
        for batch in batches:
            for chunk in outbox.add(batch):
                producer.send(chunk)
        for chunk in outbox.finish():
            producer.send(chunk)
    finally:
        producer.close()
    return producer.commit


def _task_context() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("write() runs in a Spark task only (no TaskContext here)")
    return context


def _summary(messages: Iterable[WriterCommitMessage | None]) -> tuple[int, int, int]:
    done = [m for m in messages if isinstance(m, TaskCommit)]
    return (
        sum(sum(m.appended.values()) for m in done),
        sum(sum(m.duplicate.values()) for m in done),
        len(done),
    )


class TidelogBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tidelog")``: exactly once per job (task retries are deduplicated
    under the job id); running the job again writes the rows again."""

    def __init__(self, plan: SinkPlan, job_id: str) -> None:
        self.plan = plan
        self.job_id = job_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        task = _task_context().partitionId()
        return write_task(self.plan, batch_producer_id(self.job_id, task), task, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        appended, duplicate, tasks = _summary(messages)
        LOG.info(
            "job %s wrote %d records to %r in %d tasks (%d found already stored)",
            self.job_id,
            appended,
            self.plan.options.stream,
            tasks,
            duplicate,
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Chunks already appended stay: a log is append-only, and they are not duplicates.
        appended, _, tasks = _summary(messages)
        LOG.warning(
            "job %s failed; %d records from %d finished tasks stay in %r",
            self.job_id,
            appended,
            tasks,
            self.plan.options.stream,
        )


class TidelogStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("tidelog")``: exactly once across task retries and restarts
    from the checkpoint, under the query id and the micro-batch id."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskCommit:
        context = _task_context()
        query_id = context.getLocalProperty("sql.streaming.queryId")
        batch_id = context.getLocalProperty("streaming.sql.batchId")
        if not query_id or batch_id is None:
            raise RuntimeError(
                "the tidelog stream writer found no streaming query id or batch id in the task "
                f"(sql.streaming.queryId={query_id!r}, streaming.sql.batchId={batch_id!r})"
            )
        task = context.partitionId()
        producer_id = stream_producer_id(query_id, task)
        return write_task(self.plan, producer_id, task, int(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        appended, duplicate, tasks = _summary(messages)
        LOG.info(
            "micro-batch %d: %d records to %r from %d tasks (%d found already stored)",
            batchId,
            appended,
            self.plan.options.stream,
            tasks,
            duplicate,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Nothing to undo: the replay of this micro-batch resends the same chunks, and the
        # broker stores only those it does not hold yet.
        LOG.warning("micro-batch %d of %r aborted", batchId, self.plan.options.stream)


def batch_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> TidelogBatchWriter:
    return TidelogBatchWriter(plan(options, schema, overwrite), uuid.uuid4().hex)


def stream_writer(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> TidelogStreamWriter:
    return TidelogStreamWriter(plan(options, schema, overwrite, streaming=True))
