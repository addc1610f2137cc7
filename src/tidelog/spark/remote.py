"""What the data source asks the broker, over gRPC through :class:`tidelog.client.Client`.

Driver side (planning): partition bounds ``[oldest, next)`` and timestamp lookups. Executor side:
:func:`read_range`, the batches (``ReceivedBatch``: columns, no object per record) of exactly the
offsets ``[start, stop)`` of one partition. Every
caller opens its own connection with :func:`connect` and closes it: a connection never crosses
a process boundary (Spark pickles readers to executors).

Lookups use subscriptions that end by themselves, so none ever waits for new records:
- the oldest retained offset: a reverse subscription from ``EARLIEST`` (one record);
- the last offset with a timestamp at or before t: a reverse subscription from ``TIMESTAMP t``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import numpy as np

from tidelog.client import (
    Client,
    ClientSettings,
    ClientTls,
    InvalidArgument,
    NotFound,
    ReceivedBatch,
    StreamInfo,
    Unavailable,
)
from tidelog.errors import OffsetsLost, UnknownStream
from tidelog.spark.planning import PartitionBounds

LOG = logging.getLogger("tidelog.spark")

PROBE_RETRY_S = 2.0
"""How long reads through the chosen server retry UNAVAILABLE (a broker restarting)."""

BOUNDS_AT_ONCE = 8
"""Partitions whose bounds are asked of the broker at the same time while planning."""

FRAME_MESSAGES = 10_000
"""Records per frame asked of the server (it also caps frames at its byte limit)."""


def connect(servers: Sequence[str], tls: ClientTls, wait_s: float = 0.0) -> Client:
    """A client for the first of ``servers`` that answers (servers of one cluster are
    interchangeable for reading), secured by ``tls``; raises ``Unavailable`` naming all when
    none does, after trying them all again for up to ``wait_s`` (a broker restarting)."""
    deadline = time.monotonic() + wait_s
    while True:
        failures = []
        for server in servers:
            # A short retry budget: an unreachable server should cost the probe seconds, not
            # the client's default 10 s, before the next one is tried (Spark retries its tasks).
            settings = ClientSettings(retry_budget_s=PROBE_RETRY_S, tls=tls)
            client = Client(server, settings=settings)
            try:
                client.list_streams()
            except Unavailable as error:
                client.close()
                failures.append(f"{server}: {error}")
                continue
            return client
        if time.monotonic() >= deadline:
            raise Unavailable(
                "no tidelog server answered (option 'servers'): " + "; ".join(failures)
            )
        LOG.warning("no tidelog server answered yet; trying again: %s", "; ".join(failures))
        time.sleep(0.5)


def stream_info(client: Client, stream: str) -> StreamInfo:
    try:
        return client.stream_info(stream)
    except NotFound:
        names = sorted(s.name for s in client.list_streams() if not s.name.startswith("__"))
        raise UnknownStream(
            f"no stream {stream!r} on {client.server} (option 'stream'); streams there: "
            f"{', '.join(names) or 'none'}"
        ) from None


def oldest_offset(client: Client, stream: str, partition: int) -> int | None:
    """The oldest retained offset; ``None`` when the partition holds no record."""
    frames = client.subscribe_batches(
        stream, partition, start="earliest", reverse=True, max_messages=1
    )
    try:
        for batch in frames:
            return batch.first_offset
    finally:
        _close(frames)
    return None


def _close(frames: Iterator[ReceivedBatch]) -> None:
    """End a subscription early (the client's iterators are generators)."""
    close = getattr(frames, "close", None)
    if close is not None:
        close()


def bounds(
    client: Client, stream: str, partitions: Sequence[int], *, known: bool = False
) -> dict[int, PartitionBounds]:
    """``[oldest, next)`` of each partition, committed records only (the high watermark as the
    partition's leader has it: in a cluster a follower's may trail what was acknowledged).
    The partitions are asked at once (their two lookups each take a round trip to the broker);
    ``known``: the caller has just checked that the stream exists."""
    if not known:
        stream_info(client, stream)  # an unknown stream: the error that lists the streams there

    def one(partition: int) -> PartitionBounds:
        next_offset = client.partition_info(stream, partition).high_watermark + 1
        oldest = oldest_offset(client, stream, partition) if next_offset > 0 else None
        return PartitionBounds(
            partition, next_offset if oldest is None else min(oldest, next_offset), next_offset
        )

    if len(partitions) < 2:
        return {p: one(p) for p in partitions}
    # The client is thread-safe (its calls run on its own event loop): threads only wait.
    with ThreadPoolExecutor(min(len(partitions), BOUNDS_AT_ONCE)) as pool:
        return dict(zip(partitions, pool.map(one, partitions), strict=True))


def last_at_or_before(client: Client, stream: str, partition: int, nanos: int) -> int | None:
    """The last committed offset whose timestamp is at or before ``nanos`` (ns since the
    epoch), or ``None`` when every record is younger.

    The client takes a ``datetime`` (µs, converted through a float), so the subscription starts
    a little later than ``nanos`` and the frames' own ns timestamps decide exactly."""
    if nanos < 0:
        return None
    moment = datetime.fromtimestamp((nanos // 1000 + 2) / 1e6, UTC)
    frames = client.subscribe_batches(
        stream, partition, start=moment, reverse=True, max_messages=1000
    )
    try:
        for batch in frames:
            hits = np.flatnonzero(batch.timestamps <= nanos)  # descending: the first is the last
            if hits.size:
                return int(batch.offsets[hits[0]])
    finally:
        _close(frames)
    return None


def first_at_or_after(client: Client, bounds: PartitionBounds, stream: str, ms: int) -> int:
    """The first offset whose timestamp is at or after ``ms`` (ms since the epoch): the next
    offset when none is."""
    before = last_at_or_before(client, stream, bounds.partition, ms * 1_000_000 - 1)
    return bounds.oldest if before is None else max(before + 1, bounds.oldest)


def end_before(client: Client, bounds: PartitionBounds, stream: str, ms: int) -> int:
    """The exclusive end offset of the records with a timestamp before ``ms``."""
    before = last_at_or_before(client, stream, bounds.partition, ms * 1_000_000 - 1)
    return bounds.oldest if before is None else min(before + 1, bounds.next)


def read_range(
    client: Client,
    stream: str,
    partition: int,
    start: int,
    stop: int,
    *,
    reverse: bool = False,
    fail_on_data_loss: bool = True,
    values: bool = True,
) -> Iterator[ReceivedBatch]:
    """The batches holding exactly the committed records of offsets ``[start, stop)``, oldest
    first (``reverse``: newest first); ``values=False``: without their value bytes (the server
    does not send them). Offsets below the oldest retained one are lost to
    retention: :class:`OffsetsLost` with ``fail_on_data_loss``, else a warning in the log and
    the rest of the range. Gaps (compaction) are not losses."""
    if stop <= start:
        return
    frames = _subscribe(client, stream, partition, start, stop, reverse=reverse, values=values)
    lowest = None
    try:
        for batch in frames or ():
            if not reverse and lowest is None:
                lowest = batch.first_offset
                if lowest > start:
                    _check_loss(client, stream, partition, start, stop, fail_on_data_loss)
            elif reverse:
                lowest = batch.last_offset
            yield batch
    finally:
        if frames is not None:
            _close(frames)
    if (reverse and (lowest is None or lowest > start)) or (not reverse and lowest is None):
        _check_loss(client, stream, partition, start, stop, fail_on_data_loss)


def _subscribe(
    client: Client,
    stream: str,
    partition: int,
    start: int,
    stop: int,
    *,
    reverse: bool,
    values: bool = True,
) -> Iterator[ReceivedBatch] | None:
    """The subscription for ``[start, stop)``; ``None`` when retention removed all of it
    (the server refuses a stop below the retained start)."""
    first, last = (stop - 1, start) if reverse else (start, stop - 1)
    try:
        return client.subscribe_batches(
            stream,
            partition,
            start=first,
            stop=last,
            reverse=reverse,
            max_messages=FRAME_MESSAGES,
            values=values,
        )
    except InvalidArgument:
        oldest = oldest_offset(client, stream, partition)
        if oldest is not None and oldest > start:
            return None  # the caller reports the loss
        raise


def _check_loss(
    client: Client, stream: str, partition: int, start: int, stop: int, fail: bool
) -> None:
    oldest = oldest_offset(client, stream, partition)
    if oldest is not None and oldest <= start:
        return  # a gap, not a loss
    lost_to = stop if oldest is None else min(oldest, stop)
    message = (
        f"offsets {start}..{lost_to - 1} of {stream!r} partition {partition} were removed by "
        f"retention before this query read them"
    )
    if fail:
        raise OffsetsLost(message + "; set option failOnDataLoss=false to skip them with a warning")
    LOG.warning("%s; skipped (failOnDataLoss=false)", message)
