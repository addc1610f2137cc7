"""Helpers of the sink's Spark tests: reading a whole stream back, publishing input."""

from __future__ import annotations

from tidelog.client import Client, ReceivedMessage


def read_all(client: Client, stream: str) -> dict[int, list[ReceivedMessage]]:
    """Every committed message of every partition, in offset order."""
    found: dict[int, list[ReceivedMessage]] = {}
    for partition in client.stream_info(stream).partitions:
        number = partition.partition
        if partition.high_watermark < 0:
            found[number] = []
            continue
        found[number] = list(client.subscribe(stream, number, start="earliest", stop="latest"))
    return found


def values_of(client: Client, stream: str) -> list[bytes]:
    return [m.value for ms in read_all(client, stream).values() for m in ms]


def publish_numbers(client: Client, stream: str, partitions: int, count: int) -> None:
    """Values ``b"0"``..``b"<count-1>"``, round robin over the partitions."""
    for p in range(partitions):
        values = [b"%d" % i for i in range(p, count, partitions)]
        for first in range(0, len(values), 5000):
            client.publish_batch(stream, values[first : first + 5000], partition=p)


def assert_exactly_once(values: list[bytes], count: int) -> None:
    """``values`` are ``b"0"``..``b"<count-1>"``, each once: no gap, no duplicate."""
    numbers = sorted(int(v) for v in values)
    duplicates = (
        sorted({n for n in numbers if numbers.count(n) > 1}) if len(numbers) < 50_000 else []
    )
    missing = sorted(set(range(count)) - set(numbers))
    assert (len(numbers), missing[:20], duplicates[:20]) == (count, [], [])
