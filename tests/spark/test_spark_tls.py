"""The Spark source and sink against a server that requires mutual TLS: the options ``tlsCa``,
``tlsCert`` and ``tlsKey`` reach every connection, the planner's and each executor's (which see
only the pickled read range or write plan). One test each: a Spark job is slow."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sink_support import read_all
from tests.support.server import ServerProcess, served

from tidelog.client import Client, ClientSettings, ClientTls, Message
from tidelog.security.testca import issue, make_ca

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class Secured:
    server: ServerProcess
    tls: ClientTls
    options: dict[str, str]
    """The Spark options of a client holding the certificate of principal ``spark-job``."""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    pki = tmp_path_factory.mktemp("pki")
    ca = make_ca(pki)
    server_cert = issue(ca, pki, "server")
    job = issue(ca, pki, "spark-job")
    with served(
        tmp_path_factory.mktemp("mtls") / "data",
        *("--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)),
        *("--tls-client-ca", str(ca.cert)),
    ) as process:
        options = {
            "servers": process.address,
            "tlsCa": str(ca.cert),
            "tlsCert": str(job.cert),
            "tlsKey": str(job.key),
        }
        yield Secured(process, ClientTls(ca=ca.cert, cert=job.cert, key=job.key), options)


@pytest.fixture(scope="module")
def client(secured: Secured) -> Iterator[Client]:
    with Client(secured.server.address, settings=ClientSettings(tls=secured.tls)) as connection:
        yield connection


def test_the_source_reads_over_mutual_tls(spark: Any, secured: Secured, client: Client) -> None:
    client.create_stream("tls-in", partitions=2)
    for partition in range(2):
        client.publish_batch(
            "tls-in",
            [Message(b"p%d-%d" % (partition, i), key=b"k") for i in range(30)],
            partition=partition,
        )
    rows = (
        spark.read.format("tidelog")
        .options(**secured.options)
        .option("stream", "tls-in")
        .option("maxOffsetsPerPartition", "10")  # several executor tasks, each its own channel
        .load()
        .collect()
    )
    assert sorted((r.partition, r.offset, r.value) for r in rows) == [
        (p, i, b"p%d-%d" % (p, i)) for p in range(2) for i in range(30)
    ]


def test_the_sink_writes_over_mutual_tls(spark: Any, secured: Secured, client: Client) -> None:
    client.create_stream("tls-out", partitions=2)
    frame = spark.createDataFrame(
        [(f"v{i}", i % 2) for i in range(40)], "value STRING, partition INT"
    ).repartition(2)
    (
        frame.write.format("tidelog")
        .mode("append")
        .options(**secured.options)
        .option("stream", "tls-out")
        .save()
    )
    stored = read_all(client, "tls-out")
    assert sorted(m.value for ms in stored.values() for m in ms) == sorted(
        f"v{i}".encode() for i in range(40)
    )
    assert all(int(m.value[1:]) % 2 == p for p, ms in stored.items() for m in ms)
