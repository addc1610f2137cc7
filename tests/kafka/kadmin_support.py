"""What the Kafka admin and idempotence tests share: an in-process server with a Kafka listener,
and a raw Kafka connection whose requests are built with kio and sent as exact frames (to replay
one byte for byte, or to send what no client would)."""

from __future__ import annotations

import contextlib
import io
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

from tidelog.api.server import Server
from tidelog.api.settings import load_settings
from tidelog.process import free_port
from tidelog.security.testca import Issued, issue, make_ca


@contextlib.asynccontextmanager
async def kafka_served(data_dir: Path, **settings: Any) -> AsyncIterator[Server]:
    """A started server (gRPC and Kafka on free loopback ports), stopped when the block ends.
    ``settings`` add to or override the defaults (``load_settings`` flags)."""
    server = Server(
        load_settings(
            **{
                "data_dir": data_dir,
                "host": "127.0.0.1",
                "port": 0,
                "metrics_port": 0,
                "kafka_port": free_port(),
                **settings,
            }
        )
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Principals:
    """A test CA and the mutual-TLS client contexts of named principals."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = make_ca(directory)
        self.server = issue(self.ca, directory, "server")

    def context(self, name: str) -> ssl.SSLContext:
        """A client context presenting a certificate for ``name`` (mutual TLS)."""
        issued: Issued = issue(self.ca, self.directory, name)
        context = ssl.create_default_context(cafile=str(self.ca.cert))
        context.load_cert_chain(issued.cert, issued.key)
        return context

    def settings(self, acl: Path) -> dict[str, Any]:
        """Server settings for TLS with client certificates and the ACL in ``acl``."""
        return {
            "tls_cert": self.server.cert,
            "tls_key": self.server.key,
            "tls_client_ca": self.ca.cert,
            "acl_file": acl,
        }


def payload_class(api_key: int, version: int, kind: EntityType) -> type[Any]:
    suffix = "Request" if kind is EntityType.request else "Response"
    module = load_payload_module(api_key, version, kind)  # type: ignore[arg-type]
    for name, value in vars(module).items():
        if isinstance(value, type) and name.endswith(suffix) and value.__type__ is kind:
            return value
    raise LookupError(module.__name__)


def schema(api_key: int, version: int, kind: EntityType = EntityType.request) -> Any:
    """kio's module of an api's request (or response) at ``version``, for its nested classes."""
    return load_payload_module(api_key, version, kind)  # type: ignore[arg-type]


class KafkaWire:
    """One blocking Kafka connection: frames built from kio request objects, answers read back
    as kio response objects."""

    def __init__(
        self, port: int, tls: ssl.SSLContext | None = None, client_id: str = "kadmin-test"
    ) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.sock: socket.socket = (
            tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls is not None else raw
        )
        self.client_id = client_id
        self._correlation = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def frame(self, body: Any) -> bytes:
        """The whole request frame (size included) carrying ``body``, with a fresh correlation
        id."""
        self._correlation += 1
        cls = type(body)
        header_cls = RequestHeaderV2 if cls.__flexible__ else RequestHeaderV1
        header = header_cls(
            request_api_key=cls.__api_key__,
            request_api_version=cls.__version__,
            correlation_id=self._correlation,
            client_id=self.client_id,
        )
        out = io.BytesIO()
        entity_writer(header_cls)(out, header)
        entity_writer(cls)(out, body)
        payload = out.getvalue()
        return struct.pack(">i", len(payload)) + payload

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def receive(self, request: Any) -> Any:
        """The answer to ``request`` (sent before, by :meth:`send`)."""
        size = struct.unpack(">i", self._exactly(4))[0]
        data = self._exactly(size)
        cls = type(request)
        response = payload_class(cls.__api_key__, cls.__version__, EntityType.response)
        used = 4  # the correlation id
        if response.__flexible__ and cls.__api_key__ != 18:
            used += 1  # the header's (empty) tagged fields
        body, _ = entity_reader(response)(data, used)
        return body

    def call(self, body: Any) -> Any:
        self.send(self.frame(body))
        return self.receive(body)

    def _exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)


def record_batch(
    values: list[bytes],
    *,
    producer_id: int = -1,
    epoch: int = -1,
    base_sequence: int = -1,
    timestamp_ms: int = 1_000,
) -> bytes:
    """A RecordBatch v2 of ``values`` (uncompressed), with the producer state given."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=base_sequence,
        batch_size=1 << 20,
    )
    for offset, value in enumerate(values):
        builder.append(offset, timestamp_ms, None, value, [])
    return bytes(builder.build())


def produce_request(topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    """A Produce v9 request of ``records`` to one partition."""
    module = schema(0, 9)
    return module.ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=timedelta(seconds=10),
        topic_data=(
            module.TopicProduceData(
                name=topic,
                partition_data=(module.PartitionProduceData(index=partition, records=records),),
            ),
        ),
    )


def init_producer_id(version: int = 4, producer_id: int = -1, epoch: int = -1) -> Any:
    module = schema(22, version)
    fields: dict[str, Any] = {
        "transactional_id": None,
        "transaction_timeout": timedelta(seconds=60),
    }
    if version >= 3:
        fields.update(producer_id=producer_id, producer_epoch=epoch)
    return module.InitProducerIdRequest(**fields)


def create_topic(kafka: KafkaWire, name: str, partitions: int = 1) -> None:
    """Create ``name`` through CreateTopics (Produce creates nothing)."""
    module = schema(19, 7)
    topic = module.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=-1,
        assignments=(),
        configs=(),
    )
    answer = kafka.call(module.CreateTopicsRequest(topics=(topic,), timeout=timedelta(seconds=10)))
    assert answer.topics[0].error_message is None, answer


def create_request(*topics: Any, validate_only: bool = False, version: int = 7) -> Any:
    return schema(19, version).CreateTopicsRequest(
        topics=topics, timeout=timedelta(seconds=10), validate_only=validate_only
    )


def creatable(
    name: str,
    partitions: int = 1,
    factor: int = -1,
    configs: dict[str, str] | None = None,
    assignments: tuple[Any, ...] = (),
    version: int = 7,
) -> Any:
    module = schema(19, version)
    return module.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=factor,
        assignments=assignments,
        configs=tuple(
            module.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()
        ),
    )


def describe_request(*resources: tuple[int, str, tuple[str, ...] | None]) -> Any:
    module = schema(32, 4)
    return module.DescribeConfigsRequest(
        resources=tuple(
            module.DescribeConfigsResource(
                resource_type=kind, resource_name=name, configuration_keys=keys
            )
            for kind, name, keys in resources
        ),
        include_synonyms=False,
        include_documentation=True,
    )
