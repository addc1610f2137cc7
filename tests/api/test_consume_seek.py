"""Consume with seeks: after ``seek()`` returns, the next message is the one at the seek
position, and nothing read before the seek is ever handed out."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess

from tidelog import Client


@pytest.fixture
def delayed_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server that waits 0.3 s between reading a Consume batch and sending it: a seek sent
    meanwhile is handled while an old batch is in flight (the race, made deterministic)."""
    process = ServerProcess(tmp_path / "data", env={"TIDELOG_TEST_READ_DELAY_S": "0.3"}).start()
    try:
        yield process
    finally:
        process.kill()


def test_receive_then_seek_back_and_forward(server: ServerProcess) -> None:
    with Client(server.address) as client:
        client.create_stream("s")
        client.publish_batch("s", [b"m%d" % i for i in range(100)])
        with client.consumer("s", start="earliest", prefetch=10) as consumer:
            got = [consumer.receive(timeout=10) for _ in range(30)]
            assert [m.offset for m in got if m] == list(range(30))
            consumer.seek(5)
            assert [consumer.receive(timeout=10).offset for _ in range(3)] == [5, 6, 7]
            consumer.seek(90)
            assert consumer.receive(timeout=10).offset == 90
            consumer.seek(to="earliest")
            assert consumer.receive(timeout=10).offset == 0
            consumer.seek(to="latest")
            assert consumer.receive(timeout=10).offset == 99
            assert consumer.receive(timeout=0.3) is None  # nothing newer yet
            client.publish("s", b"later")
            assert consumer.receive(timeout=10).offset == 100
            consumer.commit()
        assert client.fetch_cursor("consumer", "s") == 100


def test_reverse_consumer_seeks_too(server: ServerProcess) -> None:
    with Client(server.address) as client:
        client.create_stream("r")
        client.publish_batch("r", [b"m%d" % i for i in range(50)])
        with client.consumer("r", start="latest", reverse=True, prefetch=8) as consumer:
            assert [consumer.receive(timeout=10).offset for _ in range(3)] == [49, 48, 47]
            consumer.seek(10)
            assert [consumer.receive(timeout=10).offset for _ in range(3)] == [10, 9, 8]


def test_a_batch_read_before_the_seek_is_never_handed_out(
    delayed_server: ServerProcess,
) -> None:
    with Client(delayed_server.address) as client:
        client.create_stream("s")
        client.publish_batch("s", [b"m%d" % i for i in range(200)])
        with client.consumer("s", start="earliest", prefetch=50) as consumer:
            # The server has read offsets 0..49 and holds them for 0.3 s; seek meanwhile.
            time.sleep(0.1)
            consumer.seek(150)
            first = consumer.receive(timeout=10)
            assert first is not None and first.offset == 150
            rest = [consumer.receive(timeout=10).offset for _ in range(10)]
            assert rest == list(range(151, 161))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_random_seeks_while_publishers_run(server: ServerProcess, reverse: bool) -> None:
    rng = random.Random(11 if reverse else 5)
    with Client(server.address) as client:
        client.create_stream("busy")
        client.publish_batch("busy", [b"%d" % i for i in range(500)])
        stop = threading.Event()

        def publish() -> None:
            with Client(server.address) as publisher:
                for _ in range(200):
                    if stop.is_set():
                        return
                    publisher.publish_batch("busy", [b"x"] * rng.randint(1, 20))
                    time.sleep(0.005)

        thread = threading.Thread(target=publish)
        thread.start()
        try:
            start = "latest" if reverse else "earliest"
            with client.consumer("busy", start=start, reverse=reverse, prefetch=64) as consumer:
                for _ in range(40):
                    for _ in range(rng.randint(0, 30)):
                        assert consumer.receive(timeout=10) is not None
                    # Targets with 34+ messages beyond them in the consumer's direction among
                    # the first 500, so no read depends on how far the publisher got.
                    target = rng.randint(40, 499) if reverse else rng.randint(0, 460)
                    consumer.seek(target)
                    message = consumer.receive(timeout=10)
                    assert message is not None and message.offset == target
                    step = -1 if reverse else 1
                    following = [consumer.receive(timeout=10) for _ in range(3)]
                    assert [m.offset for m in following if m] == [
                        target + step * (i + 1) for i in range(3)
                    ]
        finally:
            stop.set()
            thread.join(30)
