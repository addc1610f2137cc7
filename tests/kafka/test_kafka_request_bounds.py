"""What one Kafka request may ask of the broker (``bounds.py``, and the handlers that apply it),
over a real broker in-process: a Fetch's budgets lowered to the listener's cap and a partition
named twice read once, repeats refused in ListOffsets, Produce and OffsetCommit, a response too
large for a frame refused, the element counts of a request bounded; and the produce fixes: a
partition's batches written all or none, and a producer id's owner checked before its sequence."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from tests.broker.brokertools import broker_config
from tests.kafka.kadmin_support import kafka_served, record_batch
from tests.kafka.kafka_wire import call, connect, decode, frame, receive

from tidelog.broker import Broker, StreamConfig
from tidelog.control import Advertised, SingleBroker
from tidelog.kafka import fetch, groups, offsets, produce
from tidelog.kafka.bounds import (
    LIGHT_REQUEST_MAX_BYTES,
    MAX_ITEMS,
    MAX_TOP_ITEMS,
    RequestTooBig,
    check_counts,
    check_frame,
)
from tidelog.kafka.protocol import (
    FrameStart,
    RecordChunks,
    Request,
    ResponseTooLarge,
    build,
    encode_response,
    encode_response_parts,
    nested,
    schema_module,
)
from tidelog.kafka.session import KafkaConfig, OpenGate, Session

T = TypeVar("T")
_correlation = itertools.count(1)
COMMIT = 8


class Served:
    """A broker with streams ``t`` (1 partition) and ``small`` (records of at most 1 KiB)."""

    def __init__(self, broker: Broker, control: SingleBroker) -> None:
        self.broker = broker
        self.control = control

    def session(self, identity: str = "alice", **config: Any) -> Session:
        return Session(
            self.control,
            KafkaConfig(**config),
            OpenGate(),
            "127.0.0.1:40000",
            ("127.0.0.1", 9092),
            identity=identity,
            authenticated=True,
        )

    def values(self, stream: str) -> list[bytes]:
        reader = self.broker.partition(stream, 0).log.forward_reader(0)
        found: list[bytes] = []
        while batch := reader.read(100_000, 1 << 24):
            found += batch.values()
        return found


def run(scenario: Callable[[Served], Coroutine[Any, Any, T]], tmp_path: Path) -> T:
    async def main() -> T:
        broker = Broker(broker_config(tmp_path))
        await broker.start()
        control = SingleBroker(broker, Advertised(broker.broker_id, "127.0.0.1", 1))
        await control.create_stream("t", StreamConfig(partitions=1), 1, 1)
        await control.create_stream("small", StreamConfig(max_message_bytes=1024), 1, 1)
        try:
            return await scenario(Served(broker, control))
        finally:
            control.broker.drain()
            await broker.close()

    return asyncio.run(asyncio.wait_for(main(), 60))


def request(api_key: int, version: int, **fields: Any) -> Request:
    module = schema_module(api_key, version, EntityType.request)
    cls = next(
        v
        for k, v in vars(module).items()
        if k.endswith("Request") and getattr(v, "__type__", None) is EntityType.request
    )
    return Request(api_key, version, next(_correlation), "test", build(cls, **fields))


def part(api_key: int, version: int, cls: str, /, **fields: Any) -> Any:
    return build(getattr(schema_module(api_key, version, EntityType.request), cls), **fields)


async def answered(handler: Any, session: Session, req: Request) -> Any:
    """The handler's answer, encoded as a check that its version carries it."""
    answer = await handler(session, req)
    encode_response(req, answer)
    return answer


def produce_request(topic: str, parts: list[tuple[int, bytes]]) -> Request:
    return request(
        0,
        9,
        transactional_id=None,
        acks=-1,
        timeout=timedelta(seconds=5),
        topic_data=(
            part(
                0,
                9,
                "TopicProduceData",
                name=topic,
                partition_data=tuple(
                    part(0, 9, "PartitionProduceData", index=i, records=r) for i, r in parts
                ),
            ),
        ),
    )


def fetch_request(topic: str, copies: int, max_bytes: int = 0x7FFFFFFF) -> Request:
    wanted = part(
        1,
        12,
        "FetchPartition",
        partition=0,
        current_leader_epoch=-1,
        fetch_offset=0,
        last_fetched_epoch=-1,
        log_start_offset=-1,
        partition_max_bytes=0x7FFFFFFF,
    )
    return request(
        1,
        12,
        cluster_id=None,
        replica_id=-1,
        max_wait=timedelta(0),
        min_bytes=1,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(part(1, 12, "FetchTopic", topic=topic, partitions=(wanted,) * copies),),
        forgotten_topics_data=(),
        rack_id="",
    )


def partitions_of(answer: Any) -> list[Any]:
    return [p for topic in answer.responses for p in topic.partitions]


# -- Fetch ----------------------------------------------------------------------------------------


def test_a_fetch_is_held_to_the_listener_cap_and_reads_a_repeated_partition_once(
    tmp_path: Path,
) -> None:
    async def scenario(served: Served) -> None:
        session = served.session(fetch_max_bytes=1 << 20)
        big = record_batch([bytes([i]) * 100_000 for i in range(10)])  # ~1 MB a request
        for _ in range(4):
            answer = await answered(produce.handle, session, produce_request("t", [(0, big)]))
            assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
        asked = fetch_request("t", 60)
        answer = await answered(fetch.handle, session, asked)
        got = partitions_of(answer)
        assert len(got) == 60
        assert got[0].error_code == ErrorCode.none
        assert all(p.error_code == ErrorCode.invalid_request for p in got[1:])
        assert all(len(p.records) == 0 for p in got[1:])
        # the client asked for 2 GiB; the cap is 1 MiB (plus at most one read's worth)
        size = sum(map(len, encode_response_parts(asked, answer)))
        assert 0 < len(got[0].records) <= (1 << 20) + 200_000
        assert size < 2 << 20

    run(scenario, tmp_path)


def test_a_response_above_an_int32_frame_is_refused_not_encoded() -> None:
    start = FrameStart(1, 12, 7)
    chunk = bytes(64 << 20)
    huge = RecordChunks([chunk] * 33)  # 2.06 GiB, by reference only
    records = nested(
        start,
        "PartitionData",
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=0,
        last_stable_offset=0,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=huge,
    )
    schema = schema_module(1, 12, EntityType.response)
    body = schema.FetchResponse(
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(schema.FetchableTopicResponse(topic="t", partitions=(records,)),),
    )
    with pytest.raises(ResponseTooLarge):
        encode_response_parts(start, body)


# -- repeats elsewhere ----------------------------------------------------------------------------


def test_list_offsets_answers_a_repeated_partition_invalid_request(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        wanted = part(
            2, 7, "ListOffsetsPartition", partition_index=0, current_leader_epoch=-1, timestamp=-1
        )
        req = request(
            2,
            7,
            replica_id=-1,
            isolation_level=0,
            topics=(part(2, 7, "ListOffsetsTopic", name="t", partitions=(wanted,) * 3),),
        )
        answer = await answered(offsets.list_offsets, served.session(), req)
        codes = [p.error_code for p in answer.topics[0].partitions]
        assert codes == [ErrorCode.none, ErrorCode.invalid_request, ErrorCode.invalid_request]

    run(scenario, tmp_path)


def test_produce_answers_a_repeated_partition_invalid_request_and_writes_it_once(
    tmp_path: Path,
) -> None:
    async def scenario(served: Served) -> None:
        one = record_batch([b"once"])
        answer = await answered(
            produce.handle, served.session(), produce_request("t", [(0, one), (0, one), (0, one)])
        )
        codes = [p.error_code for p in answer.responses[0].partition_responses]
        assert codes == [ErrorCode.none, ErrorCode.invalid_request, ErrorCode.invalid_request]
        assert served.values("t") == [b"once"]

    run(scenario, tmp_path)


def test_offset_commit_answers_a_repeated_partition_invalid_request(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        commit = {entry[0]: entry[4] for entry in groups.SERVED}[COMMIT]
        wanted = [
            part(
                COMMIT,
                8,
                "OffsetCommitRequestPartition",
                partition_index=0,
                committed_offset=offset,
                committed_leader_epoch=-1,
                committed_metadata="",
            )
            for offset in (5, 9)
        ]
        req = request(
            COMMIT,
            8,
            group_id="g",
            generation_id_or_member_epoch=-1,
            member_id="",
            group_instance_id=None,
            topics=(
                part(COMMIT, 8, "OffsetCommitRequestTopic", name="t", partitions=tuple(wanted)),
            ),
        )
        answer = await answered(commit, served.session(), req)
        codes = [p.error_code for p in answer.topics[0].partitions]
        assert codes == [ErrorCode.none, ErrorCode.invalid_request]
        stored = await served.control.fetch_cursor("__group:g", "t", 0)
        assert stored == 4  # the first commit (5, stored as the last offset read), not 9

    run(scenario, tmp_path)


# -- counts and frames ----------------------------------------------------------------------------


def metadata_body(count: int) -> Any:
    module = schema_module(3, 12, EntityType.request)
    return module.MetadataRequest(
        topics=tuple(
            module.MetadataRequestTopic(topic_id=None, name=f"t{i}") for i in range(count)
        ),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )


def test_a_request_over_the_element_bounds_is_refused() -> None:
    check_counts(metadata_body(MAX_TOP_ITEMS))
    with pytest.raises(RequestTooBig, match="topics"):
        check_counts(metadata_body(MAX_TOP_ITEMS + 1))
    # under the top-level bound, over the bound on every array together
    per_topic = MAX_ITEMS // 10
    fetch_many = fetch_request("t", per_topic).body
    check_counts(fetch_many)
    many_topics = dataclasses.replace(fetch_many, topics=fetch_many.topics * 10)
    with pytest.raises(RequestTooBig):
        check_counts(many_topics)


def test_frames_of_light_apis_are_bounded_below_the_listener_limit() -> None:
    limit = 100 << 20
    check_frame(0, limit, limit)  # Produce: the listener's limit
    check_frame(14, limit, limit)  # SyncGroup too
    check_frame(3, LIGHT_REQUEST_MAX_BYTES, limit)
    with pytest.raises(RequestTooBig):
        check_frame(3, LIGHT_REQUEST_MAX_BYTES + 1, limit)


# -- produce: all or none, owner first ------------------------------------------------------------


def test_a_partition_whose_second_batch_is_refused_writes_neither(tmp_path: Path) -> None:
    async def scenario(served: Served) -> None:
        good = record_batch([b"a", b"b", b"c"])
        big = record_batch([b"x" * 2048])  # above the stream's 1 KiB records
        answer = await answered(
            produce.handle, served.session(), produce_request("small", [(0, good + big)])
        )
        result = answer.responses[0].partition_responses[0]
        assert result.error_code == ErrorCode.message_too_large
        assert served.values("small") == []
        # two plain batches together are stored together, in order
        answer = await answered(
            produce.handle, served.session(), produce_request("small", [(0, good + good)])
        )
        assert answer.responses[0].partition_responses[0].base_offset == 0
        assert served.values("small") == [b"a", b"b", b"c"] * 2

    run(scenario, tmp_path)


def test_two_batches_of_an_idempotent_producer_in_one_partition_are_refused(
    tmp_path: Path,
) -> None:
    async def scenario(served: Served) -> None:
        first = record_batch([b"a"], producer_id=7, epoch=0, base_sequence=0)
        second = record_batch([b"b"], producer_id=7, epoch=0, base_sequence=1)
        answer = await answered(
            produce.handle, served.session(), produce_request("t", [(0, first + second)])
        )
        assert answer.responses[0].partition_responses[0].error_code == ErrorCode.invalid_request
        assert served.values("t") == []

    run(scenario, tmp_path)


@pytest.mark.parametrize(
    ("epoch", "base"),
    [(0, 0), (0, 1), (0, 5), (0, 0x7FFF_0000), (1, 0), (1, 3)],
)
def test_another_principal_learns_nothing_of_a_producer_ids_sequence(
    tmp_path: Path, epoch: int, base: int
) -> None:
    async def scenario(served: Served) -> None:
        alice, mallory = served.session("alice"), served.session("mallory")
        for sequence in range(3):  # alice at epoch 1, sequence 2
            mine = record_batch([b"alice"], producer_id=42, epoch=1, base_sequence=sequence)
            answer = await answered(produce.handle, alice, produce_request("t", [(0, mine)]))
            assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none
        forged = record_batch([b"mallory"], producer_id=42, epoch=epoch, base_sequence=base)
        answer = await answered(produce.handle, mallory, produce_request("t", [(0, forged)]))
        refused = answer.responses[0].partition_responses[0]
        assert refused.error_code == ErrorCode.topic_authorization_failed
        assert "another principal" in (refused.error_message or "")
        assert served.values("t") == [b"alice"] * 3

    run(scenario, tmp_path)


# -- over a listener ------------------------------------------------------------------------------


def many_partitions_fetch() -> Any:
    """A Fetch of 99,000 partitions (1,000 topics that do not exist): allowed, and about a
    second of the broker's work."""
    wanted = tuple(
        part(
            1,
            12,
            "FetchPartition",
            partition=i,
            current_leader_epoch=-1,
            fetch_offset=0,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1000,
        )
        for i in range(99)
    )
    topics = tuple(part(1, 12, "FetchTopic", topic=f"x{t}", partitions=wanted) for t in range(1000))
    return dataclasses.replace(fetch_request("t", 1).body, topics=topics)


def test_a_huge_metadata_is_refused_at_once_and_a_large_fetch_holds_no_one_up(
    tmp_path: Path,
) -> None:
    def wire(port: int) -> None:
        with connect(port) as hostile:
            started = time.monotonic()
            hostile.sendall(frame(metadata_body(MAX_TOP_ITEMS + 1)))
            assert receive(hostile) is None  # closed, not answered
            assert time.monotonic() - started < 2.0
        large_frame = frame(many_partitions_fetch(), 5)
        # Served with turns: ~0.2-0.45 s of a 1.7 s Fetch here; without them 0.70-0.76 s, every
        # time. Other work on the machine can stretch one attempt (0.90 s of 2.09 s was seen in a
        # CI run), so the best of three attempts is judged.
        shares: list[str] = []
        for _ in range(3):
            with connect(port, timeout=60) as large, connect(port) as other:
                started = time.monotonic()
                large.sendall(large_frame)
                time.sleep(0.5)  # decoded by now; being served
                asked = time.monotonic()
                versions = call(
                    other, ApiVersionsRequest(client_software_name="t", client_software_version="1")
                )
                waited = time.monotonic() - asked
                assert versions.error_code == ErrorCode.none
                data = receive(large)
                took = time.monotonic() - started
                assert data is not None
                _, answer = decode(1, 12, data)
                assert len(answer.responses) == 1000
                assert took > 0.5  # the test measures something
            if waited < took / 3:
                return
            shares.append(f"{waited:.2f} s of a {took:.2f} s Fetch")
        raise AssertionError(f"ApiVersions waited {', '.join(shares)}")

    async def scenario() -> None:
        async with kafka_served(tmp_path / "data") as server:
            await asyncio.to_thread(wire, server.kafka_port)

    asyncio.run(scenario())
