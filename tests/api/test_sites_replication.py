"""Delta replication between real servers (docs/replication.md): payloads transmitted on a source
site arrive at each destination's receive queue once, in order, across a kill -9 of the sink and
of the source."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

import tidelog
from tidelog.sites.sink import POSITION_HEADER, receive_queue

DEADLINE_S = 60.0


def received(address: str, client: str, source: str) -> list[tuple[int, bytes]]:
    """(position, payload) of every record in a sink's receive queue."""
    with tidelog.Client(address) as client_:
        names = [s.name for s in client_.list_streams()]
        name = receive_queue(client, source)
        if name not in names or client_.stream_info(name).partitions[0].high_watermark < 0:
            return []
        return [
            (int.from_bytes(m.headers[POSITION_HEADER], "big"), m.value)
            for m in client_.subscribe(name, start="earliest", stop="latest")
        ]


def wait_for(
    address: str, client: str, source: str, count: int, deadline_s: float = DEADLINE_S
) -> list[tuple[int, bytes]]:
    """What the receive queue holds once it holds ``count`` entries, or after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while True:
        found = received(address, client, source)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, ServerProcess]]:
    with (
        served(tmp_path / "a", "--site-id", "a") as a,
        served(tmp_path / "b", "--site-id", "b") as b,
        served(tmp_path / "c", "--site-id", "c") as c,
    ):
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
            client.add_site("c", c.address)
        yield a, b, c


def test_each_payload_reaches_exactly_its_destinations_in_order(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    """100,000 payloads of 100 bytes, each to a random non-empty subset of {b, c}."""
    a, b, c = sites
    rng = random.Random(13)
    expected: dict[str, list[bytes]] = {"b": [], "c": []}
    payload_bytes = 0
    with tidelog.Client(a.address) as client:
        for round_ in range(100):
            items = []
            for i in range(1000):
                destinations = rng.choice([["b"], ["c"], ["b", "c"]])
                payload = b"%08d-%04d-" % (round_, i) + b"x" * 86
                items.append((payload, destinations))
                payload_bytes += len(payload)
                for site in destinations:
                    expected[site].append(payload)
            client.transmit_many("orders", items)
    for sink, site in ((b, "b"), (c, "c")):
        wait_for_count(sink.address, "orders", "a", len(expected[site]))
        got = received(sink.address, "orders", "a")
        assert [payload for _, payload in got] == expected[site], "exactly its own, in order"
        positions = [p for p, _ in got]
        assert positions == sorted(set(positions)), "no duplicate, in position order"
    # Bytes on disk, as du counts them: the active segment's index is a sparse preallocation.
    queue = a.data_dir / "streams" / "__lrq_delta"
    queue_bytes = sum(f.stat().st_blocks * 512 for f in queue.rglob("*") if f.is_file())
    ratio = queue_bytes / payload_bytes
    print(f"source delta queue: {queue_bytes} bytes for {payload_bytes} payload bytes: {ratio:.3f}")
    assert ratio < 1.2, "each payload stored once, whatever its number of destinations"


def wait_for_count(address: str, client: str, source: str, count: int) -> None:
    """Until a receive queue holds ``count`` records (reads its high watermark only)."""
    name = receive_queue(client, source)
    deadline = time.monotonic() + DEADLINE_S
    with tidelog.Client(address) as client_:
        while time.monotonic() < deadline:
            listed = name in {s.name for s in client_.list_streams()}
            if listed and client_.stream_info(name).partitions[0].high_watermark + 1 >= count:
                return
            time.sleep(0.2)


def test_a_sink_killed_mid_stream_resumes_without_gaps_or_duplicates(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    a, b, _ = sites
    payloads = [b"p%05d" % i for i in range(3000)]
    with tidelog.Client(a.address) as client:
        for start in range(0, 1500, 100):
            client.transmit_many("orders", [(p, ["b"]) for p in payloads[start : start + 100]])
        b.kill()  # kill -9, whatever it was doing
        for start in range(1500, 3000, 100):
            client.transmit_many("orders", [(p, ["b"]) for p in payloads[start : start + 100]])
    b.extra += ["--port", str(b.port)]  # back at the address the source knows
    b.start()
    got = wait_for(b.address, "orders", "a", len(payloads))
    assert [payload for _, payload in got] == payloads


def test_a_source_killed_mid_stream_resumes_from_what_the_sink_applied(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    a, b, _ = sites
    payloads = [b"q%05d" % i for i in range(2000)]
    with tidelog.Client(a.address) as client:
        for start in range(0, 2000, 100):
            client.transmit_many("jobs", [(p, ["b"]) for p in payloads[start : start + 100]])
    a.kill()
    a.start()
    got = wait_for(b.address, "jobs", "a", len(payloads))
    assert [payload for _, payload in got] == payloads


def test_status_tells_caught_up_from_stalled(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    a, b, _ = sites
    with socket.socket() as probe:  # an address where nothing listens
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    with tidelog.Client(a.address) as client:
        client.add_site("dead", dead)
        client.transmit_many("orders", [(b"x%d" % i, ["b", "dead"]) for i in range(5)])
        wait_for(b.address, "orders", "a", 5)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            states = {s.site_id: s for s in client.site_status()}
            if states["b"].caught_up or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert states["b"].caught_up and not states["b"].stalled
    assert (states["b"].lag_entries, states["b"].state) == (0, "log_entry_sync")
    assert states["b"].last_ack_unix_s is not None
    gone = states["dead"]
    assert gone.lag_entries == 5 and gone.lag_seconds >= 0
    assert gone.stalled and not gone.caught_up, "a site that never acked is never lag 0"
    assert gone.reason  # why it is not syncing (the connection error)
    assert states["c"].lag_entries == 0  # nothing was for c


def test_a_listener_gets_every_entry_and_a_failing_callback_skips_nothing(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    a, b, c = sites
    with tidelog.Client(c.address) as client:  # a second source for b
        client.add_site("b", b.address)
        client.transmit_many("orders", [(b"c%03d" % i, ["b"]) for i in range(50)])
    with tidelog.Client(a.address) as client:
        client.transmit_many("orders", [(b"a%03d" % i, ["b"]) for i in range(300)])
    wait_for(b.address, "orders", "a", 300)
    wait_for(b.address, "orders", "c", 50)

    first: list[tidelog.RoutedMessage] = []
    crashed = threading.Event()

    def fail_at_150(entry: tidelog.RoutedMessage) -> None:
        if entry.source_site == "a" and len([e for e in first if e.source_site == "a"]) == 150:
            crashed.set()
            raise RuntimeError("the application crashed")
        first.append(entry)

    with tidelog.Client(b.address) as client:
        listener = client.routing_listener("orders", fail_at_150, commit_every=40, discover_s=0.1)
        listener.start()
        assert crashed.wait(DEADLINE_S), "the callback never reached entry 150"
        with pytest.raises(RuntimeError, match="crashed"):
            listener.stop()
        again: list[tidelog.RoutedMessage] = []
        with client.routing_listener("orders", again.append, discover_s=0.1):
            deadline = time.monotonic() + DEADLINE_S
            while (
                time.monotonic() < deadline
                and len({(e.source_site, e.position) for e in first + again}) < 350
            ):
                time.sleep(0.1)
    for source, count in (("a", 300), ("c", 50)):
        before = [e.payload for e in first if e.source_site == source]
        after = [e.payload for e in again if e.source_site == source]
        # The second listener starts at or before where the first stopped: nothing skipped,
        # and only entries after the last commit are handed over twice.
        expected = {b"%s%03d" % (source.encode(), i) for i in range(count)}
        assert set(before) | set(after) == expected
        assert after == sorted(after) and before == sorted(before)
        assert len(set(before) & set(after)) <= 40
    assert len([e for e in again if e.source_site == "a"]) >= 150  # a resumed where it failed


def test_two_way_replication_does_not_loop(
    sites: tuple[ServerProcess, ServerProcess, ServerProcess],
) -> None:
    a, b, _ = sites
    with tidelog.Client(b.address) as client:
        client.add_site("a", a.address)  # b -> a, beside a -> b
        client.transmit_many("chat", [(b"from-b-%d" % i, ["a"]) for i in range(100)])
    with tidelog.Client(a.address) as client:
        client.transmit_many("chat", [(b"from-a-%d" % i, ["b"]) for i in range(100)])
    at_a = wait_for(a.address, "chat", "b", 100)
    at_b = wait_for(b.address, "chat", "a", 100)
    assert [v for _, v in at_a] == [b"from-b-%d" % i for i in range(100)]
    assert [v for _, v in at_b] == [b"from-a-%d" % i for i in range(100)]
    time.sleep(1.0)  # had received entries been sent on, they would come back by now
    for address, source in ((a.address, "a"), (b.address, "b")):
        assert received(address, "chat", source) == [], "a site never receives its own entries"
        with tidelog.Client(address) as client:
            state = {s.site_id: s for s in client.site_status()}
            other = "b" if source == "a" else "a"
            assert state[other].lag_entries == 0
    assert len(received(a.address, "chat", "b")) == 100
    assert len(received(b.address, "chat", "a")) == 100


def queue_bytes(data_dir: Path) -> int:
    """Record bytes of the source's delta queue on disk (its segments' log files; one the
    upkeep releases between the listing and its size counts nothing)."""
    total = 0
    for path in (data_dir / "streams" / "__lrq_delta" / "0").glob("*.log"):
        with contextlib.suppress(FileNotFoundError):
            total += path.stat().st_size
    return total


def test_the_source_queue_shrinks_once_every_sink_acknowledged(tmp_path: Path) -> None:
    # Small segments and a quick upkeep on the source, so releases show within the test.
    quick = {"TIDELOG_SEGMENT_MAX_BYTES": "65536", "TIDELOG_MAINTENANCE_INTERVAL_S": "0.2"}
    with (
        served(tmp_path / "a", "--site-id", "a", env=quick) as a,
        served(tmp_path / "b", "--site-id", "b") as b,
        served(tmp_path / "c", "--site-id", "c") as c,
    ):
        for sink in (b, c):  # down while the payloads are stored: nothing is acknowledged
            sink.kill()
            sink.extra += ["--port", str(sink.port)]  # back later at the address declared
        payloads = [b"%05d" % i + b"x" * 1000 for i in range(2000)]
        with tidelog.Client(a.address) as client:
            client.add_site("b", b.address)
            client.add_site("c", c.address)
            for start in range(0, len(payloads), 100):
                chunk = payloads[start : start + 100]
                client.transmit_many("orders", [(p, ["b", "c"]) for p in chunk])
        stored = queue_bytes(tmp_path / "a")
        assert stored > len(payloads) * 1000
        time.sleep(1.0)  # several upkeep passes: sites that acknowledged nothing hold it all
        assert queue_bytes(tmp_path / "a") == stored
        for sink in (b, c):
            sink.start()
        for sink in (b, c):
            assert len(wait_for(sink.address, "orders", "a", len(payloads))) == len(payloads)
        deadline = time.monotonic() + DEADLINE_S
        while queue_bytes(tmp_path / "a") > stored // 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert queue_bytes(tmp_path / "a") <= stored // 4, "acknowledged entries stayed"
        # What is left still serves: a new payload reaches both sinks after the release.
        with tidelog.Client(a.address) as client:
            client.transmit_many("orders", [(b"after", ["b", "c"])])
        for sink in (b, c):
            got = wait_for(sink.address, "orders", "a", len(payloads) + 1)
            assert got[-1][1] == b"after" and len(got) == len(payloads) + 1
